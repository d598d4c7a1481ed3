package validate

import (
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/promqltest"
)

// TestRecordingRulesEvaluate runs the recording rules of rules.yaml (their
// text, not a copy) on synthetic series with Prometheus' engine, like
// `promtool test rules`.
func TestRecordingRulesEvaluate(t *testing.T) {
	groups := loadRules(t)
	expr := func(record string) string {
		r := findRule(groups, record)
		if r == nil {
			t.Fatalf("no recording rule %s", record)
		}
		return strings.Join(strings.Fields(r.Expr), " ")
	}
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)

	// Per second: 1 first, 1/3 replay, 1/3 conflict, 10 invalid. Invalid
	// records are not in the duplicate rate's denominator (SPEC).
	promqltest.RunTest(t, `
load 1m
  idemstream_records_total{pipeline="p",outcome="first",instance="a"}    0+60x20
  idemstream_records_total{pipeline="p",outcome="replay",instance="a"}   0+20x20
  idemstream_records_total{pipeline="p",outcome="conflict",instance="a"} 0+20x20
  idemstream_records_total{pipeline="p",outcome="invalid",instance="a"}  0+600x20
  idemstream_records_total{pipeline="p",outcome="failed",instance="a"}   0+0x20
  idemstream_records_total{pipeline="idle",outcome="first",instance="a"}  0+0x20
  idemstream_records_total{pipeline="idle",outcome="replay",instance="a"} 0+0x20
  idemstream_consumer_lag{pipeline="p",partition="0",instance="a"} 100x20
  idemstream_consumer_lag{pipeline="p",partition="0",instance="b"} 100x20
  idemstream_consumer_lag{pipeline="p",partition="1",instance="b"} 50x20

eval instant at 10m `+expr("idemstream:duplicate_rate:ratio_rate5m")+`
  {pipeline="p"} 0.2

eval instant at 10m `+expr("idemstream:conflict_rate:ratio_rate5m")+`
  {pipeline="p"} 0.2

eval instant at 10m `+expr("idemstream:consumer_lag:sum")+`
  {pipeline="p"} 150
`, engine)
}
