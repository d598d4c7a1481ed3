package audit

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// Duration is written as a Go duration string ("10m", "1.5s").
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Candidate is a pointer with the keys in which it differed between
// copies.
type Candidate struct {
	Pointer  string   `json:"pointer"`
	Keys     int64    `json:"keys"`
	Share    float64  `json:"share"`
	Examples []string `json:"examples,omitempty"`
}

// Conflicts are keys reused with another body: copies that differ at a
// pointer that is not volatile.
type Conflicts struct {
	Keys     int64       `json:"keys"`
	Pointers []Candidate `json:"pointers"`
}

// Intervals are the times between consecutive copies of a key.
type Intervals struct {
	Count int64    `json:"count"`
	P50   Duration `json:"p50"`
	P90   Duration `json:"p90"`
	P99   Duration `json:"p99"`
	Max   Duration `json:"max"`
}

// Reused are keys seen again long after any retry would come: business
// keys (an order id, say) used as idempotency keys.
type Reused struct {
	Keys     int64    `json:"keys"`
	Examples []string `json:"examples"`
	Longest  Duration `json:"longest_gap"`
}

// Suggested is the configuration the audit proposes.
type Suggested struct {
	Semantics              string   `json:"semantics"`
	Window                 Duration `json:"window"`
	ClientMaxRetryInterval Duration `json:"client_max_retry_interval"`
	Volatile               []string `json:"volatile"`
	Unordered              []string `json:"unordered"`
	// Why says, in one line each, where the window and interval come from.
	Why []string `json:"why,omitempty"`
}

// Rules are the rules the audit started from.
type Rules struct {
	Configured    bool     `json:"configured"`
	Volatile      []string `json:"volatile"`
	Unordered     []string `json:"unordered"`
	Window        Duration `json:"window"`
	VolatileShare float64  `json:"volatile_share"`
}

// Report is the outcome of an audit: docs/audit.md names its members.
type Report struct {
	Topic      string `json:"topic"`
	Partitions int    `json:"partitions"`
	Records    int64  `json:"records"`
	Keys       int64  `json:"keys"`
	// Copies counts keys by how many valid records carried them.
	Copies map[string]int64 `json:"copies"`
	// Retries are the valid records after the first of their key.
	Retries             int64               `json:"retries"`
	Invalid             map[string]int64    `json:"invalid"`
	InvalidExamples     map[string][]string `json:"invalid_examples"`
	VolatileCandidates  []Candidate         `json:"volatile_candidates"`
	UnorderedCandidates []Candidate         `json:"unordered_candidates"`
	Conflicts           Conflicts           `json:"conflicts"`
	RetryInterval       Intervals           `json:"retry_interval"`
	ReusedAfterWindow   Reused              `json:"reused_after_window"`
	Suggested           Suggested           `json:"suggested"`
	Decisions           Decisions           `json:"decisions"`
	Rules               Rules               `json:"rules"`
	// Truncated counts payloads with more values than a summary keeps;
	// values past the limit were not compared.
	Truncated int64 `json:"truncated_payloads"`
	// DecisionWindow is the window the decisions ran with: the
	// suggested one, or the pipeline's with a configuration.
	DecisionWindow Duration `json:"decision_window"`
	// Passes is 2 when the records were read again to decide them under
	// the suggested rules.
	Passes int `json:"passes"`
}

// minVolatileKeys is the fewest keys a volatile candidate needs: with one
// or two retried keys a share says nothing.
const minVolatileKeys = 3

// Report summarizes the first pass. Decisions are filled in by Run.
func (a *analyzer) Report() *Report { return report([]*analyzer{a}) }

// report summarizes the first pass of analyzers that each saw the
// records of some keys (Run shards keys over the processors).
func report(shards []*analyzer) *Report {
	a0 := shards[0]
	r := newReport(a0.opts)
	sum := shardSum{parts: map[int]bool{}, pointers: map[string]*pointerStats{}, reorders: map[string]*pointerStats{}}
	for _, a := range shards {
		sum.add(r, a)
	}
	r.Partitions = len(sum.parts)
	volatile := sum.candidates(r, a0.opts.VolatileShare)
	for _, a := range shards {
		for _, ks := range a.keys {
			for _, g := range ks.diffs {
				if g&genReorder == 0 && !volatile[a.gen(g)] {
					r.Conflicts.Keys++
					break
				}
			}
		}
	}
	h := &sum.intervals
	r.RetryInterval = Intervals{Count: int64(h.n), P50: Duration(h.quantile(0.5)), P90: Duration(h.quantile(0.9)),
		P99: Duration(h.quantile(0.99)), Max: Duration(h.max)}
	r.Suggested = a0.suggest(r)
	r.ReusedAfterWindow = reused(shards, r.Suggested.Window.D())
	return r
}

// newReport is an empty report under opts, every invalid reason listed.
func newReport(opts Options) *Report {
	pol := opts.Policy
	r := &Report{
		Copies:          map[string]int64{"1": 0, "2": 0, "3+": 0},
		Invalid:         map[string]int64{},
		InvalidExamples: map[string][]string{},
		Passes:          1,
		Rules: Rules{
			Configured: opts.Configured, Volatile: nonNil(pol.Rules.Volatile), Unordered: nonNil(pol.Rules.Unordered),
			Window: Duration(pol.Window), VolatileShare: opts.VolatileShare,
		},
	}
	for _, reason := range []dedupe.Reason{dedupe.ReasonMissingKey, dedupe.ReasonInvalidKey, dedupe.ReasonMalformedPayload, dedupe.ReasonPayloadTooLarge} {
		r.Invalid[string(reason)] = 0
		r.InvalidExamples[string(reason)] = []string{}
	}
	return r
}

// shardSum is what the shards' first passes add up to beyond the report's
// own counts: the partitions seen, the retry intervals, the pointers that
// differed between copies of a key (reordered ones apart), and how many
// keys came more than once.
type shardSum struct {
	parts              map[int]bool
	intervals          histogram
	pointers, reorders map[string]*pointerStats
	multi              int64
}

// add counts shard a into r and s.
func (s *shardSum) add(r *Report, a *analyzer) {
	if r.Topic == "" {
		r.Topic = a.topic
	}
	r.Records += a.records
	r.Keys += int64(len(a.keys))
	r.Truncated += a.truncated
	for p := range a.parts {
		s.parts[p] = true
	}
	for reason, st := range a.invalid {
		r.Invalid[string(reason)] += st.count
		ex := r.InvalidExamples[string(reason)]
		r.InvalidExamples[string(reason)] = append(ex, st.examples[:min(len(st.examples), maxExamples-len(ex))]...)
	}
	for _, ks := range a.keys {
		switch {
		case ks.copies == 1:
			r.Copies["1"]++
		case ks.copies == 2:
			r.Copies["2"]++
		default:
			r.Copies["3+"]++
		}
		if ks.copies > 1 {
			s.multi++
		}
		r.Retries += int64(ks.copies) - 1
	}
	s.intervals.merge(&a.intervals)
	mergeStats(s.pointers, a, a.pointers)
	mergeStats(s.reorders, a, a.reorders)
}

// mergeStats adds a's stats of each pointer (by generalized path) into
// into, keeping two examples at most.
func mergeStats(into map[string]*pointerStats, a *analyzer, from map[uint32]*pointerStats) {
	for gen, st := range from {
		m := into[a.gen(gen)]
		if m == nil {
			m = &pointerStats{}
			into[a.gen(gen)] = m
		}
		m.keys += st.keys
		for _, e := range st.examples {
			if len(m.examples) < 2 && !slices.Contains(m.examples, e) {
				m.examples = append(m.examples, e)
			}
		}
	}
}

// share is the share of the keys seen more than once that keys is.
func (s *shardSum) share(keys int64) float64 {
	if s.multi == 0 {
		return 0
	}
	return float64(keys) / float64(s.multi)
}

// candidates fills r's volatile, conflict and unordered candidates, most
// keys first, and returns the pointers proposed as volatile: those that
// changed in at least volatileShare of the keys seen more than once.
func (s *shardSum) candidates(r *Report, volatileShare float64) map[string]bool {
	volatile := map[string]bool{}
	r.VolatileCandidates, r.Conflicts.Pointers = []Candidate{}, []Candidate{}
	for ptr, st := range s.pointers {
		c := Candidate{Pointer: ptr, Keys: st.keys, Share: round3(s.share(st.keys)), Examples: st.examples}
		if s.share(st.keys) >= volatileShare && st.keys >= minVolatileKeys {
			volatile[ptr] = true
			r.VolatileCandidates = append(r.VolatileCandidates, c)
		} else {
			r.Conflicts.Pointers = append(r.Conflicts.Pointers, c)
		}
	}
	r.UnorderedCandidates = []Candidate{}
	for ptr, st := range s.reorders {
		r.UnorderedCandidates = append(r.UnorderedCandidates, Candidate{Pointer: ptr, Keys: st.keys, Share: round3(s.share(st.keys))})
	}
	for _, l := range [][]Candidate{r.VolatileCandidates, r.Conflicts.Pointers, r.UnorderedCandidates} {
		slices.SortFunc(l, func(x, y Candidate) int {
			return cmp.Or(cmp.Compare(y.Keys, x.Keys), cmp.Compare(x.Pointer, y.Pointer))
		})
	}
	return volatile
}

// suggest proposes the window, the retry interval and the rules.
func (a *analyzer) suggest(r *Report) Suggested {
	pol := a.opts.Policy
	s := Suggested{Semantics: string(dedupe.Strict)}
	if a.opts.Configured {
		s.Semantics = string(pol.Semantics)
	}
	clientMax := DefaultClientMaxRetryInterval
	if a.opts.Configured && a.opts.ClientMaxRetryInterval > 0 {
		clientMax = a.opts.ClientMaxRetryInterval
	}
	if r.RetryInterval.Count > 0 {
		clientMax = max(readableUp(r.RetryInterval.P99.D()), time.Second)
		s.Why = append(s.Why, "client_max_retry_interval: p99 of "+itoa(r.RetryInterval.Count)+" retry intervals ("+r.RetryInterval.P99.String()+"), rounded up")
	} else {
		s.Why = append(s.Why, "client_max_retry_interval: no key seen twice, kept "+Duration(clientMax).String())
	}
	window := readableUp(clientMax * 3 / 2)
	base := dedupe.Strict.DefaultWindow()
	if a.opts.Configured {
		base = pol.Window
	}
	if window < base {
		s.Why = append(s.Why, "window: "+Duration(base).String()+" (the "+map[bool]string{true: "pipeline's", false: "default"}[a.opts.Configured]+" window) covers 1.5 × "+Duration(clientMax).String())
		window = base
	} else {
		s.Why = append(s.Why, "window: 1.5 × "+Duration(clientMax).String()+", rounded up")
	}
	s.Window, s.ClientMaxRetryInterval = Duration(window), Duration(clientMax)

	s.Volatile = slices.Clone(pol.Rules.Volatile)
	for _, c := range r.VolatileCandidates {
		if !slices.Contains(s.Volatile, c.Pointer) {
			s.Volatile = append(s.Volatile, c.Pointer)
		}
	}
	s.Unordered = slices.Clone(pol.Rules.Unordered)
	for _, c := range r.UnorderedCandidates {
		if !slices.Contains(s.Unordered, c.Pointer) {
			s.Unordered = append(s.Unordered, c.Pointer)
		}
	}
	s.Volatile, s.Unordered = nonNil(s.Volatile), nonNil(s.Unordered)
	return s
}

// reused finds the keys seen again more than window after their previous
// copy, longest gaps first.
func reused(shards []*analyzer, window time.Duration) Reused {
	var hits []*keyState
	for _, a := range shards {
		for _, ks := range a.keys {
			if ks.maxGap > int64(window) {
				hits = append(hits, ks)
			}
		}
	}
	slices.SortFunc(hits, func(x, y *keyState) int {
		return cmp.Or(cmp.Compare(y.maxGap, x.maxGap), cmp.Compare(x.key, y.key))
	})
	out := Reused{Keys: int64(len(hits)), Examples: []string{}}
	for _, ks := range hits[:min(len(hits), maxExamples)] {
		out.Examples = append(out.Examples, ks.key)
	}
	if len(hits) > 0 {
		out.Longest = Duration(hits[0].maxGap)
	}
	return out
}

// DefaultClientMaxRetryInterval is assumed when no key was retried.
const DefaultClientMaxRetryInterval = 30 * time.Second

var ladder = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond,
	50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 20 * time.Second,
	30 * time.Second, 45 * time.Second, time.Minute, 2 * time.Minute, 3 * time.Minute, 5 * time.Minute,
	10 * time.Minute, 15 * time.Minute, 20 * time.Minute, 30 * time.Minute, 45 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// readableUp rounds d up to a duration a person would write: 1, 2, 5,
// 10, 15, 20, 30, 45 of a unit, or whole days.
func readableUp(d time.Duration) time.Duration {
	for _, l := range ladder {
		if d <= l {
			return l
		}
	}
	day := 24 * time.Hour
	return (d + day - 1) / day * day
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
