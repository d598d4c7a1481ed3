package dlq

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/dedupe"
)

// printer writes lines and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

// f prints a line (or lines) without the spaces that padding leaves at
// their ends.
func (p *printer) f(format string, args ...any) {
	if p.err != nil {
		return
	}
	lines := strings.Split(fmt.Sprintf(format, args...), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	_, p.err = io.WriteString(p.w, strings.Join(lines, "\n"))
}

// plural is "1 dead letter", "2 dead letters".
func plural(n int64, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(n, 10) + " " + many
}

const stamp = "2006-01-02 15:04:05"

// ago says how long before now t was, rounded to what a person reads.
func ago(t, now time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "in the future"
	case d < time.Minute:
		return d.Round(time.Second).String() + " ago"
	case d < 48*time.Hour:
		return audit.Duration(d.Round(time.Minute)).String() + " ago"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + " days ago"
}

// WriteText writes the summary as a person reads it in a terminal; now is
// what the ages are counted from.
func (s *Summary) WriteText(w io.Writer, now time.Time) error {
	p := &printer{w: w}
	p.f("Dead letters of pipeline %s in %s (%s, from %s to the end offsets seen at start): %d of %s read.\n",
		s.Pipeline, s.Topic, plural(int64(s.Partitions), "partition", "partitions"), s.From, s.DeadLetters, plural(s.Records, "record", "records"))
	if s.OtherSources > 0 {
		p.f("  %s of other pipelines sharing the topic (not from %s): not counted.\n", plural(s.OtherSources, "dead letter", "dead letters"), s.Input)
	}
	if s.Foreign > 0 {
		p.f("  %s without idemstream-reason (not written by idemstream): not counted.\n", plural(s.Foreign, "record", "records"))
	}
	if s.DeadLetters == 0 {
		p.f("\nNo dead letters.\n")
		return p.err
	}
	p.f("\n  %s of %s; first %s UTC (%s), last %s UTC (%s).\n",
		plural(s.DeadLetters, "dead letter", "dead letters"), plural(s.Keys, "key", "keys"), s.FirstSeen.Format(stamp), ago(*s.FirstSeen, now), s.LastSeen.Format(stamp), ago(*s.LastSeen, now))
	if s.Trimmed > 0 {
		p.f("  %s trimmed to fit the topic (part of the payload only): redrive reads the whole record at its source.\n",
			plural(s.Trimmed, "dead letter", "dead letters"))
	}
	if s.Redriven > 0 {
		p.f("  %s of commands redriven before that failed again (idemstream-redrive-of).\n", plural(s.Redriven, "dead letter", "dead letters"))
	}
	p.f("\n  %-20s %12s %8s  %-19s  %-19s  %s\n", "reason", "dead letters", "keys", "first seen (UTC)", "last seen (UTC)", "latest")
	var sent, refused []string
	for _, r := range s.Reasons {
		p.f("  %-20s %12d %8d  %s  %s  %d/%d\n", r.Reason, r.Count, r.Keys, r.FirstSeen.Format(stamp), r.LastSeen.Format(stamp),
			r.Latest.Partition, r.Latest.Offset)
		if r.Redrivable {
			sent = append(sent, string(r.Reason))
		} else {
			refused = append(refused, string(r.Reason))
		}
	}
	if len(sent) > 0 {
		p.f("\n  redrive sends %s.\n", strings.Join(sent, ", "))
	}
	if len(refused) > 0 {
		p.f("  redrive refuses %s without --force: they would come straight back.\n", strings.Join(refused, ", "))
	}
	s.writeHours(p)
	s.writeLists(p)
	p.f("\nNext: `idemstream dlq show --pipeline %s PARTITION/OFFSET` explains one (latest above);\n", s.Pipeline)
	p.f("      `idemstream dlq redrive --pipeline %s --reason handler_failed --dry-run` lists what a redrive would send.\n", s.Pipeline)
	return p.err
}

// writeHours draws the per-hour histogram. Hours without dead letters are
// drawn too while the span is two days or less.
func (s *Summary) writeHours(p *printer) {
	if len(s.Hours) == 0 {
		return
	}
	hours := s.Hours
	first, last := hours[0].Hour, hours[len(hours)-1].Hour
	if last.Sub(first) <= 48*time.Hour {
		byHour := map[time.Time]Hour{}
		for _, h := range hours {
			byHour[h.Hour] = h
		}
		hours = nil
		for t := first; !t.After(last); t = t.Add(time.Hour) {
			h, ok := byHour[t]
			if !ok {
				h = Hour{Hour: t}
			}
			hours = append(hours, h)
		}
	}
	var most int64
	for _, h := range hours {
		most = max(most, h.Count)
	}
	p.f("\nPer hour (UTC):\n")
	for _, h := range hours {
		bar := strings.Repeat("█", int((h.Count*40+most-1)/most))
		p.f("  %s  %-40s %8d  %s\n", h.Hour.Format("2006-01-02 15:04"), bar, h.Count, reasonsLine(h.Reasons))
	}
}

func reasonsLine(m map[dedupe.Reason]int64) string {
	if len(m) < 2 {
		return ""
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", r, m[r]))
	}
	return strings.Join(parts, ", ")
}

func (s *Summary) writeLists(p *printer) {
	if len(s.Errors) > 0 {
		p.f("\nCommonest errors:\n")
		for _, e := range s.Errors {
			p.f("  %8d  %-20s %s\n", e.Count, e.Reason, clip(e.Error, 160))
		}
	}
	var conflicts int64
	for _, r := range s.Reasons {
		if r.Reason == dedupe.ReasonConflict {
			conflicts = r.Count
		}
	}
	if conflicts == 0 {
		return
	}
	unknown := ""
	if s.ConflictsWithoutPaths > 0 {
		unknown = fmt.Sprintf(", %d of which name no path: their first copy could not be read", s.ConflictsWithoutPaths)
	}
	p.f("\nConflicts differ at (%s%s):\n", plural(conflicts, "conflict", "conflicts"), unknown)
	for _, c := range s.ConflictPaths {
		ptr := c.Pointer
		if ptr == "" {
			ptr = `"" (the whole payload)`
		}
		p.f("  %8d  %s\n", c.Count, ptr)
	}
	// A first copy named by one conflict says nothing the count does not.
	if len(s.FirstSources) > 0 && s.FirstSources[0].Count > 1 {
		p.f("\nFirst copies that several conflicts differ from (a key reused for several commands):\n")
		for _, c := range s.FirstSources {
			if c.Count > 1 {
				p.f("  %8d  %s\n", c.Count, c.Source)
			}
		}
	}
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// WriteText writes the dead letter and its evidence for a person.
func (s *Shown) WriteText(w io.Writer) error {
	p := &printer{w: w}
	line := func(label, format string, args ...any) { p.f("%-13s "+format+"\n", append([]any{label}, args...)...) }
	line("dead letter", "%s  written %s UTC", s.DeadLetter, s.Time.Format(stamp))
	line("pipeline", "%s", s.Pipeline)
	line("reason", "%s", s.Reason)
	line("error", "%s", s.Error)
	line("key", "%s", orNone(s.Key))
	line("fingerprint", "%s", orNone(s.Fingerprint))
	line("source", "%s", copyLine(s.Source))
	if !s.RedriveOf.IsZero() {
		line("redrive of", "%s (the command was redriven before, and failed again)", s.RedriveOf)
	}
	if s.Trimmed {
		line("trimmed", "the dead letter carries part of the payload's %d bytes; the whole record is at its source", s.PayloadSize)
	}
	if s.First != nil {
		line("first copy", "%s  %s", copyLine(*s.First), s.First.Fingerprint)
		line("differs at", "%s (as the dead letter names them)", pathList(s.ConflictPaths))
	}
	if d := s.Diff; d != nil {
		switch {
		case d.Error != "":
			line("diff now", "cannot compare under the current rules: %s", d.Error)
		case d.Same:
			line("diff now", "the same request under the current rules %s: the rules changed since", d.Rules)
		default:
			line("diff now", "%s (under the current rules %s)", pathList(d.Paths), d.Rules)
		}
	}
	if s.Now.Reason != "" {
		line("now", "still %s under the current rules: %s", s.Now.Reason, s.Now.Error)
	} else {
		line("now", "valid under the current rules: key %s, fingerprint %s", s.Now.Key, s.Now.Fingerprint)
	}
	if s.Redrive.Allowed {
		line("redrive", "yes: %s", s.Redrive.Why)
	} else {
		line("redrive", "not without --force: %s", s.Redrive.Why)
	}
	p.f("record\n")
	line("  key", "%s", bytesText(s.Record.Key))
	for _, h := range s.Record.Headers {
		line("  header", "%s: %s", h.Key, bytesText(h.Value))
	}
	line("  value", "%s", bytesText(s.Record.Value))
	return p.err
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func copyLine(c Copy) string {
	if c.Position.IsZero() {
		return "(none): " + c.Why
	}
	if c.Found {
		return c.Position.String() + " (still in the topic)"
	}
	return c.Position.String() + " (cannot be read: " + c.Why + ")"
}

func pathList(paths []string) string {
	if len(paths) == 0 {
		return "(none known)"
	}
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = p
		if p == "" {
			out[i] = `"" (the whole payload)`
		}
	}
	return strings.Join(out, ", ")
}

func bytesText(b Bytes) string {
	switch {
	case b == nil:
		return "(null)"
	case utf8.Valid(b):
		return clip(string(b), 4096)
	}
	return fmt.Sprintf("(%d bytes, not UTF-8; -o json gives them in base64)", len(b))
}

// WriteText writes what the redrive did: with DryRun, first each record
// it would send.
func (r *RedriveReport) WriteText(w io.Writer) error {
	p := &printer{w: w}
	if r.DryRun {
		for _, x := range r.Redriven {
			p.f("would send %s -> %s/%d  %-16s key %s\n", x.DeadLetter, x.To.Topic, x.To.Partition, x.Reason, orNone(x.Key))
		}
	}
	verb, pace := "sent", ""
	if r.DryRun {
		verb = "dry run: would send"
	} else if r.Rate > 0 {
		pace = fmt.Sprintf(" at most %g a second", r.Rate)
	}
	p.f("%s %d of %d selected dead letters of pipeline %s to %s%s%s.\n", verb, r.Sent, r.Selected, r.Pipeline, r.To, pace, counts(r.SentByReason))
	if n := sum(r.Skipped); n > 0 {
		p.f("skipped %d%s:\n", n, counts(r.Skipped))
		for _, why := range SkipReasons() {
			if r.Skipped[why] > 0 {
				p.f("  %-16s %s\n", why, skipMeaning[why])
			}
		}
		for _, at := range r.TooLarge {
			p.f("  too large: %s ('idemstream dlq show' it)\n", at)
		}
	}
	if n := sum(r.Refused); n > 0 {
		p.f("refused %d%s: they would come straight back to the dead-letter topic; fix the cause, then --force sends them.\n", n, counts(r.Refused))
	}
	if r.Interrupted {
		p.f("interrupted: run the same command again; what was sent already is found on the topic it went to and skipped (%s).\n", SkippedRedrivenBefore)
	}
	return p.err
}

// skipMeaning says what each skip reason means, for the text output.
var skipMeaning = map[string]string{
	SkippedSuperseded:     "a later dead letter of the same key, with another body, is the one sent",
	SkippedDuplicate:      "the same key and body as the dead letter sent for its key",
	SkippedRedrivenBefore: "an earlier redrive wrote it already (idemstream-redrive-of)",
	SkippedHasResult:      "its key has a result in the output written since (a retry or a redrive got it through)",
	SkippedPayloadCut:     "trimmed, and its source, which holds the whole record, is gone",
	SkippedTooLarge:       "the broker refused the record for its size",
}

func sum[K comparable](m map[K]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// counts writes " (a 1, b 2)", keys sorted; "" for an empty map.
func counts[K ~string](m map[K]int64) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
