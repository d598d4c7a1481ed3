package validate

import (
	"context"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// TestRecordingRulesEvaluate runs the recording rules of rules.yaml (their
// text, not a copy) on synthetic series with Prometheus' own engine, like
// `promtool test rules`. The series live in a small in-memory storage
// below rather than in Prometheus' TSDB, whose module graph brings the
// cloud SDKs of remote write with it.
func TestRecordingRulesEvaluate(t *testing.T) {
	groups := loadRules(t)
	expr := func(record string) string {
		r := findRule(groups, record)
		if r == nil {
			t.Fatalf("no recording rule %s", record)
		}
		return strings.Join(strings.Fields(r.Expr), " ")
	}

	// Per second: 1 first, 1/3 replay, 1/3 conflict, 10 invalid. Invalid
	// records are not in the duplicate rate's denominator (docs). Samples
	// every minute for 20 minutes, as promtool's `load 1m ... 0+60x20`.
	var db memStorage
	records := func(pipeline, outcome string, perMinute float64) {
		db.load(perMinute, labels.FromStrings("__name__", "idemstream_records_total", "pipeline", pipeline, "outcome", outcome, "instance", "a"), true)
	}
	records("p", "first", 60)
	records("p", "replay", 20)
	records("p", "conflict", 20)
	records("p", "invalid", 600)
	records("p", "failed", 0)
	records("idle", "first", 0)
	records("idle", "replay", 0)
	lag := func(partition, instance string, v float64) {
		db.load(v, labels.FromStrings("__name__", "idemstream_consumer_lag", "pipeline", "p", "partition", partition, "instance", instance), false)
	}
	lag("0", "a", 100)
	lag("0", "b", 100)
	lag("1", "b", 50)

	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	at := time.Unix(0, 0).Add(10 * time.Minute)
	for _, c := range []struct {
		record string
		want   float64
	}{
		{"idemstream:duplicate_rate:ratio_rate5m", 0.2},
		{"idemstream:conflict_rate:ratio_rate5m", 0.2},
		{"idemstream:consumer_lag:sum", 150},
	} {
		q, err := engine.NewInstantQuery(context.Background(), &db, nil, expr(c.record), at)
		if err != nil {
			t.Fatalf("%s: %v", c.record, err)
		}
		res := q.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("%s: %v", c.record, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			t.Fatalf("%s: %v", c.record, err)
		}
		if len(vec) != 1 {
			t.Fatalf("%s at 10m: %v, want one series {pipeline=\"p\"}", c.record, vec)
		}
		if got := vec[0].Metric.String(); got != `{pipeline="p"}` {
			t.Errorf("%s at 10m: labels %s, want {pipeline=\"p\"}", c.record, got)
		}
		if math.Abs(vec[0].F-c.want) > 1e-9 {
			t.Errorf("%s at 10m: %v, want %v", c.record, vec[0].F, c.want)
		}
		q.Close()
	}
}

// memStorage is a storage.Queryable of float series held in memory.
type memStorage struct{ series []*storage.SeriesEntry }

// load adds a series sampled every minute from 0 to 20m: 0, v, 2v, ... for
// a counter, v throughout for a gauge.
func (m *memStorage) load(v float64, lset labels.Labels, counter bool) {
	var samples []chunks.Sample
	for i := range 21 {
		f := v
		if counter {
			f = v * float64(i)
		}
		samples = append(samples, fsample{t: int64(i) * time.Minute.Milliseconds(), f: f})
	}
	m.series = append(m.series, storage.NewListSeries(lset, samples))
}

func (m *memStorage) Querier(_, _ int64) (storage.Querier, error) { return m, nil }

func (m *memStorage) Select(_ context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var out []storage.Series
next:
	for _, s := range m.series {
		for _, matcher := range ms {
			if !matcher.Matches(s.Labels().Get(matcher.Name)) {
				continue next
			}
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].Labels(), out[j].Labels()) < 0 })
	return &seriesSet{series: out, i: -1}
}

func (m *memStorage) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (m *memStorage) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (m *memStorage) Close() error { return nil }

type seriesSet struct {
	series []storage.Series
	i      int
}

func (s *seriesSet) Next() bool                        { s.i++; return s.i < len(s.series) }
func (s *seriesSet) At() storage.Series                { return s.series[s.i] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

type fsample struct {
	t int64
	f float64
}

func (s fsample) T() int64                      { return s.t }
func (s fsample) ST() int64                     { return 0 }
func (s fsample) F() float64                    { return s.f }
func (s fsample) H() *histogram.Histogram       { return nil }
func (s fsample) FH() *histogram.FloatHistogram { return nil }
func (s fsample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s fsample) Copy() chunks.Sample           { return s }
