package audit

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// WriteText writes the report as a person reads it in a terminal. yaml,
// when not empty, is the suggested configuration, printed at the end.
func (r *Report) WriteText(w io.Writer, yaml []byte) error {
	p := &printer{w: w}
	r.textSummary(p)
	r.textCandidates(p)
	r.textRetries(p)
	r.textDecisions(p)
	s := r.Suggested
	p.f("\nSuggested: window %s, client_max_retry_interval %s, volatile %s, unordered %s.\n",
		s.Window, s.ClientMaxRetryInterval, list(s.Volatile), list(s.Unordered))
	for _, why := range s.Why {
		p.f("  %s\n", why)
	}
	if len(yaml) > 0 {
		p.f("\n%s", yaml)
	}
	return p.err
}

// invalid is how many records cannot be decided.
func (r *Report) invalid() int64 {
	n := int64(0)
	for _, c := range r.Invalid {
		n += c
	}
	return n
}

// textSummary writes the heading and the counts of records and keys.
func (r *Report) textSummary(p *printer) {
	rules := "no rules given: proposing them"
	if r.Rules.Configured {
		rules = fmt.Sprintf("the pipeline's rules: volatile %s, unordered %s, window %s",
			list(r.Rules.Volatile), list(r.Rules.Unordered), r.Rules.Window)
	}
	p.f("Audit of %s: %s records on %d partition(s), %s keys (%s).\n\n", r.Topic, num(r.Records), r.Partitions, num(r.Keys), rules)
	invalid := r.invalid()
	p.f("  %-34s %12s\n", "records read", num(r.Records))
	p.f("  %-34s %12s\n", "valid idempotency keys", num(r.Keys))
	p.f("  %-34s %12s\n", "  seen once", num(r.Copies["1"]))
	p.f("  %-34s %12s\n", "  seen twice", num(r.Copies["2"]))
	p.f("  %-34s %12s\n", "  seen 3 times or more", num(r.Copies["3+"]))
	p.f("  %-34s %12s  %s\n", "retries (copies after the first)", num(r.Retries), pct(r.Retries, r.Records))
	p.f("  %-34s %12s  %s\n", "records that cannot be decided", num(invalid), pct(invalid, r.Records))
	if r.Truncated > 0 {
		p.f("  %-34s %12s  (values past %d per payload not compared)\n", "payloads too big to compare fully", num(r.Truncated), maxEntries)
	}
}

// textCandidates writes the volatile and unordered candidates and the
// conflicts.
func (r *Report) textCandidates(p *printer) {
	multi := r.Copies["2"] + r.Copies["3+"]
	p.f("\nVolatile candidates: fields that change between copies of one key in at least %.0f%% of the %s keys seen more than once.\n",
		r.Rules.VolatileShare*100, num(multi))
	if len(r.VolatileCandidates) == 0 {
		p.f("  none\n")
	}
	for _, c := range r.VolatileCandidates {
		p.f("  %-28s %8s keys %6s   e.g. %s\n", c.Pointer, num(c.Keys), share(c.Share), examples(c.Examples))
	}
	p.f("\nUnordered candidates: arrays whose copies differ only in the order of their elements.\n")
	if len(r.UnorderedCandidates) == 0 {
		p.f("  none\n")
	}
	for _, c := range r.UnorderedCandidates {
		p.f("  %-28s %8s keys %6s\n", c.Pointer, num(c.Keys), share(c.Share))
	}
	p.f("\nConflicts: %s keys reused with another body (differing at a field that is not volatile).\n", num(r.Conflicts.Keys))
	for _, c := range r.Conflicts.Pointers {
		p.f("  %-28s %8s keys %6s   e.g. %s\n", c.Pointer, num(c.Keys), share(c.Share), examples(c.Examples))
	}
}

// textRetries writes the retry intervals, the keys reused after the
// window, and the records that cannot be decided.
func (r *Report) textRetries(p *printer) {
	ri := r.RetryInterval
	p.f("\nRetry interval (between consecutive copies of a key, record timestamps, %s intervals):\n", num(ri.Count))
	p.f("  p50 %s   p90 %s   p99 %s   max %s\n", ri.P50, ri.P90, ri.P99, ri.Max)
	ra := r.ReusedAfterWindow
	p.f("\nKeys seen again more than the window (%s) after their previous copy: %s", r.Suggested.Window, num(ra.Keys))
	if ra.Keys > 0 {
		p.f(" (longest gap %s), e.g. %s\n  A key that comes back that late is a business key (an order id?) used as an idempotency key: give each command its own key.\n",
			ra.Longest, strings.Join(ra.Examples, ", "))
	} else {
		p.f("\n")
	}
	if r.invalid() > 0 {
		p.f("\nRecords that cannot be decided, by reason (they would go to the dead-letter topic):\n")
		for _, reason := range sortedKeys(r.Invalid) {
			if n := r.Invalid[reason]; n > 0 {
				p.f("  %-20s %8s   e.g. %s\n", reason, num(n), strings.Join(r.InvalidExamples[reason], ", "))
			}
		}
	}
}

// textDecisions writes what each rule would have decided.
func (r *Report) textDecisions(p *printer) {
	d := r.Decisions
	p.f("\nWhat each rule would have decided (strict; window %s; record timestamps as the clock):\n", r.DecisionWindow)
	p.f("  %-12s %14s %16s %14s\n", "", "idemstream", "raw body (+key)", "key only")
	p.f("  %s\n", strings.Repeat("-", 60))
	rows := []struct {
		name string
		get  func(Counts) int64
	}{
		{"first", func(c Counts) int64 { return c.First }},
		{"replay", func(c Counts) int64 { return c.Replay }},
		{"conflict", func(c Counts) int64 { return c.Conflict }},
		{"invalid", func(c Counts) int64 { return c.Invalid }},
	}
	for _, row := range rows {
		p.f("  %-12s %14s %16s %14s\n", row.name, num(row.get(d.Idemstream)), num(row.get(d.RawBody)), num(row.get(d.KeyOnly)))
	}
	rulesOf := "the suggested rules"
	if r.Rules.Configured {
		rulesOf = "the pipeline's rules"
	}
	p.f("  idemstream: key + fingerprint under %s; raw body: key + hash of the bytes as sent (the incident's rule);\n  key only: every copy after the first is a replay (%s of them with another body).\n",
		rulesOf, num(d.KeyOnly.Mismatch))
}

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func list(s []string) string {
	if len(s) == 0 {
		return "[]"
	}
	return "[" + strings.Join(s, ", ") + "]"
}

func examples(ex []string) string {
	q := make([]string, len(ex))
	for i, e := range ex {
		q[i] = strconv.Quote(e)
	}
	return strings.Join(q, ", ")
}

func share(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + "%" }

func pct(n, of int64) string {
	if of == 0 {
		return ""
	}
	return "(" + share(float64(n)/float64(of)) + ")"
}

// num writes 1234567 as 1,234,567.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func sortedKeys(m map[string]int64) []string { return slices.Sorted(maps.Keys(m)) }
