package dlq

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
)

// Summary is what a dead-letter topic holds for one pipeline: the JSON
// form of `idemstream dlq summary -o json` (docs/dlq.md). Times are
// record timestamps, in UTC.
type Summary struct {
	Pipeline   string `json:"pipeline"`
	Topic      string `json:"topic"`
	Input      string `json:"input"`
	From       string `json:"from"`
	Partitions int    `json:"partitions"`
	// Records are the records read; DeadLetters those of the pipeline.
	// OtherSources are dead letters of another input (a topic shared by
	// pipelines), Foreign records idemstream did not write.
	Records      int64 `json:"records"`
	DeadLetters  int64 `json:"dead_letters"`
	OtherSources int64 `json:"other_sources"`
	Foreign      int64 `json:"foreign"`
	// Keys are the distinct idempotency keys of the pipeline's dead
	// letters (missing_key and invalid_key have none).
	Keys      int64      `json:"keys"`
	FirstSeen *time.Time `json:"first_seen"`
	LastSeen  *time.Time `json:"last_seen"`
	Reasons   []Reason   `json:"reasons"`
	// Hours count the dead letters of each hour (UTC) that has any.
	Hours []Hour `json:"hours"`
	// ConflictPaths are the JSON Pointers conflicts differ at, commonest
	// first; ConflictsWithoutPaths the conflicts that name none (the
	// first copy could not be read).
	ConflictPaths         []PathCount `json:"conflict_paths"`
	ConflictsWithoutPaths int64       `json:"conflicts_without_paths"`
	// FirstSources are the first copies conflicts were compared with,
	// commonest first: one that many conflicts name is a key reused for
	// many commands.
	FirstSources []SourceCount `json:"first_sources"`
	// Errors are the commonest idemstream-error sentences, but for
	// conflicts' (each names its own fingerprints), and without the note
	// a trimmed dead letter adds.
	Errors []ErrorCount `json:"errors"`
	// Trimmed dead letters carry part of their payload only; Redriven
	// ones are of records that were themselves redriven.
	Trimmed  int64 `json:"trimmed"`
	Redriven int64 `json:"redriven"`
}

// Reason counts the dead letters of one reason.
type Reason struct {
	Reason    dedupe.Reason `json:"reason"`
	Count     int64         `json:"count"`
	Keys      int64         `json:"keys"`
	FirstSeen time.Time     `json:"first_seen"`
	LastSeen  time.Time     `json:"last_seen"`
	// Latest is the last seen one: an example for dlq show.
	Latest Position `json:"latest"`
	// Redrivable says whether redrive sends them without --force.
	Redrivable bool `json:"redrivable"`
}

// Hour counts the dead letters of one hour, by reason.
type Hour struct {
	Hour    time.Time               `json:"hour"`
	Count   int64                   `json:"count"`
	Reasons map[dedupe.Reason]int64 `json:"reasons"`
}

// PathCount is a JSON Pointer and the conflicts that differ at it.
type PathCount struct {
	Pointer string `json:"pointer"`
	Count   int64  `json:"count"`
}

// SourceCount is a first copy and the conflicts that name it.
type SourceCount struct {
	Source string `json:"source"`
	Count  int64  `json:"count"`
}

// ErrorCount is an idemstream-error sentence and how often it occurs.
type ErrorCount struct {
	Reason dedupe.Reason `json:"reason"`
	Error  string        `json:"error"`
	Count  int64         `json:"count"`
}

// trimmedNote starts what a trimmed dead letter adds to its error.
const trimmedNote = " (the dead letter was too large"

// Top is how many conflict paths, first sources and errors a summary
// lists.
const Top = 10

// maxDistinct bounds the distinct values counted for the lists above: a
// topic whose errors all differ (an id in each) keeps memory flat.
const maxDistinct = 10000

// Summarizer counts dead letters as they are read; Summary reports.
type Summarizer struct {
	sel       Selector
	sum       Summary
	keys      map[string]struct{}
	reasons   map[dedupe.Reason]*reasonTally
	hours     map[int64]*Hour
	paths     tally
	firsts    tally
	errors    tally
	errReason map[string]dedupe.Reason
}

type reasonTally struct {
	Reason
	keys map[string]struct{}
}

// NewSummarizer returns a Summarizer of the dead letters of the pipeline
// whose input is input.
func NewSummarizer(pipeline, topic, input string) *Summarizer {
	return &Summarizer{
		sel: Selector{Input: input}, sum: Summary{Pipeline: pipeline, Topic: topic, Input: input, From: "earliest"},
		keys: map[string]struct{}{}, reasons: map[dedupe.Reason]*reasonTally{}, hours: map[int64]*Hour{},
		paths: newTally(), firsts: newTally(), errors: newTally(), errReason: map[string]dedupe.Reason{},
	}
}

// Add counts one record of the topic.
func (s *Summarizer) Add(d *DeadLetter) {
	s.sum.Records++
	switch {
	case d.Reason == "":
		s.sum.Foreign++
		return
	case !s.sel.Ours(d):
		s.sum.OtherSources++
		return
	}
	s.sum.DeadLetters++
	t := d.Time.UTC()
	if s.sum.FirstSeen == nil || t.Before(*s.sum.FirstSeen) {
		s.sum.FirstSeen = &t
	}
	if s.sum.LastSeen == nil || t.After(*s.sum.LastSeen) {
		s.sum.LastSeen = &t
	}
	s.addReason(d, t)
	hour := t.Truncate(time.Hour)
	h := s.hours[hour.Unix()]
	if h == nil {
		h = &Hour{Hour: hour, Reasons: map[dedupe.Reason]int64{}}
		s.hours[hour.Unix()] = h
	}
	h.Count++
	h.Reasons[d.Reason]++
	if d.Reason == dedupe.ReasonConflict {
		for _, p := range d.ConflictPaths {
			s.paths.add(p)
		}
		if len(d.ConflictPaths) == 0 {
			s.sum.ConflictsWithoutPaths++
		}
		if !d.FirstSource.IsZero() {
			s.firsts.add(d.FirstSource.String())
		}
	}
	// A conflict's error names its own fingerprints and first copy: the
	// paths and first sources above are its summary.
	if d.Error != "" && d.Reason != dedupe.ReasonConflict {
		msg, _, _ := strings.Cut(d.Error, trimmedNote)
		k := string(d.Reason) + "\x00" + msg
		if s.errors.add(k) {
			s.errReason[k] = d.Reason
		}
	}
	if d.Trimmed {
		s.sum.Trimmed++
	}
	if !d.RedriveOf.IsZero() {
		s.sum.Redriven++
	}
}

func (s *Summarizer) addReason(d *DeadLetter, t time.Time) {
	r := s.reasons[d.Reason]
	if r == nil {
		r = &reasonTally{Reason: Reason{Reason: d.Reason, FirstSeen: t, LastSeen: t, Latest: d.At, Redrivable: Redrivable(d.Reason)},
			keys: map[string]struct{}{}}
		s.reasons[d.Reason] = r
	}
	r.Count++
	if !t.Before(r.LastSeen) {
		r.LastSeen, r.Latest = t, d.At
	}
	r.FirstSeen = minTime(r.FirstSeen, t)
	if d.IdemKey != "" {
		r.keys[d.IdemKey] = struct{}{}
		s.keys[d.IdemKey] = struct{}{}
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Summary returns the counts so far. Reasons come commonest first (ties
// in the order of dedupe.Reasons), hours in time order.
func (s *Summarizer) Summary() *Summary {
	out := s.sum
	out.Keys = int64(len(s.keys))
	out.Reasons = make([]Reason, 0, len(s.reasons))
	for _, r := range s.reasons {
		rr := r.Reason
		rr.Keys = int64(len(r.keys))
		out.Reasons = append(out.Reasons, rr)
	}
	slices.SortFunc(out.Reasons, func(a, b Reason) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(reasonRank(a.Reason), reasonRank(b.Reason)), cmp.Compare(a.Reason, b.Reason))
	})
	out.Hours = make([]Hour, 0, len(s.hours))
	for _, h := range s.hours {
		out.Hours = append(out.Hours, *h)
	}
	slices.SortFunc(out.Hours, func(a, b Hour) int { return a.Hour.Compare(b.Hour) })
	out.ConflictPaths = []PathCount{}
	for _, e := range s.paths.top(Top) {
		out.ConflictPaths = append(out.ConflictPaths, PathCount{Pointer: e.value, Count: e.count})
	}
	out.FirstSources = []SourceCount{}
	for _, e := range s.firsts.top(Top) {
		out.FirstSources = append(out.FirstSources, SourceCount{Source: e.value, Count: e.count})
	}
	out.Errors = []ErrorCount{}
	for _, e := range s.errors.top(Top) {
		reason := s.errReason[e.value]
		out.Errors = append(out.Errors, ErrorCount{Reason: reason, Error: e.value[len(reason)+1:], Count: e.count})
	}
	return &out
}

func reasonRank(r dedupe.Reason) int {
	if i := slices.Index(dedupe.Reasons, r); i >= 0 {
		return i
	}
	return len(dedupe.Reasons)
}

// SummaryOptions say what Summarize reads.
type SummaryOptions struct {
	Pipeline, Topic, Input string
	// From describes where the read started ("earliest" when empty).
	From string
}

// Summarize reads src, a dead-letter topic, and counts the dead letters
// of the pipeline. A source that knows its partition count
// (audit.KafkaTopic) gives it.
func Summarize(ctx context.Context, src audit.Source, o SummaryOptions) (*Summary, error) {
	s := NewSummarizer(o.Pipeline, o.Topic, o.Input)
	if o.From != "" {
		s.sum.From = o.From
	}
	err := src.Scan(ctx, func(rec *dedupe.Record) error {
		d := Parse(rec)
		s.Add(&d)
		return nil
	})
	if err == nil {
		// A scan whose context ended may stop early without an error:
		// its counts would pass for the topic's.
		err = ctx.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", o.Topic, err)
	}
	out := s.Summary()
	if pc, ok := src.(interface {
		Partitions(context.Context) (int, error)
	}); ok {
		if n, err := pc.Partitions(ctx); err == nil {
			out.Partitions = n
		}
	}
	return out, nil
}

// tally counts values, at most maxDistinct distinct ones: a value first
// met once that many are counted is left out. The lists show the
// commonest values, and a topic of ever new ones has none to show.
type tally struct{ m map[string]int64 }

func newTally() tally { return tally{m: map[string]int64{}} }

// add counts v and reports whether v is counted.
func (t tally) add(v string) bool {
	if _, ok := t.m[v]; !ok && len(t.m) >= maxDistinct {
		return false
	}
	t.m[v]++
	return true
}

type entry struct {
	value string
	count int64
}

// top returns the n largest counts, ties by value.
func (t tally) top(n int) []entry {
	out := make([]entry, 0, len(t.m))
	for v, c := range t.m {
		out = append(out, entry{v, c})
	}
	slices.SortFunc(out, func(a, b entry) int { return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.value, b.value)) })
	return out[:min(n, len(out))]
}
