package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/decide"
)

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return fmt.Sprint(v)
}

func num(v any) (int64, error) {
	switch x := v.(type) {
	case int64:
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	}
	return 0, fmt.Errorf("not a number: %v", v)
}

func parseDecision(now any, rep []any, c readContext) (dedupe.Decision, error) {
	var d dedupe.Decision
	switch v := str(rep[0]); v {
	case "first":
		d.Verdict = dedupe.VerdictFirst
	case "replay":
		d.Verdict = dedupe.VerdictReplay
	case "conflict":
		d.Verdict = dedupe.VerdictConflict
	case "pending":
		d.Verdict = dedupe.VerdictPending
	case "unreadable":
		return d, unreadableEntry(c.name, errNotEntry)
	case "error":
		return d, errors.New(str(rep[2]))
	default:
		return d, fmt.Errorf("unknown verdict %q", v)
	}
	flags := str(rep[1])
	if str(rep[2]) == "" {
		nowMs, err := num(now)
		d.Entry.Now = time.UnixMilli(nowMs)
		d.Resumed, d.Rerun, d.Mismatch, d.RulesChanged = false, false, false, false
		return d, err
	}
	if len(flags) != 4 {
		return d, fmt.Errorf("bad flags %q", flags)
	}
	d.Resumed, d.Rerun, d.Mismatch, d.RulesChanged = flags[0] == '1', flags[1] == '1', flags[2] == '1', flags[3] == '1'
	e, err := parseEntry(now, rep[2], c)
	if err != nil {
		return d, err
	}
	d.Entry = e
	return d, nil
}

const sep = "\x1f"

// parseEntry decodes an entry and the server's clock from a script's
// reply.
func parseEntry(now, raw any, c readContext) (dedupe.Entry, error) {
	nowMs, err := num(now)
	if err != nil {
		return dedupe.Entry{}, err
	}
	return decodeEntry(nowMs, str(raw), c)
}

// unreadableEntry is the error of a key whose entry holds a value this
// release does not read: deciding it would write over what a later
// release may need (entry.lua, load).
func unreadableEntry(name string, cause error) error {
	return fmt.Errorf("%w: entry %s is not one this release reads (a later release wrote it, or it is not an idemstream entry): its key is not decided: %w",
		dedupe.ErrEntryUnreadable, name, cause)
}

// decodeEntry decodes a stored entry, in either format, read at nowMs on
// the server's clock under c (see readContext).
func decodeEntry(nowMs int64, raw string, c readContext) (dedupe.Entry, error) {
	var e dedupe.Entry
	if isCompact(raw) {
		if err := decodeCompact(&e, raw, c); err != nil {
			return dedupe.Entry{}, fmt.Errorf("%w: %.80q", err, raw)
		}
		e.Now = time.UnixMilli(nowMs)
		return e, nil
	}
	return decodeText(nowMs, raw)
}

// decodeText decodes a text entry: its fields in a fixed order separated
// by \x1f, the key last (entry.lua).
func decodeText(nowMs int64, raw string) (dedupe.Entry, error) {
	var e dedupe.Entry
	var err error
	e.Now = time.UnixMilli(nowMs)
	// The fields, split on the stack: an entry is read for every
	// completion and for most decisions of a known key.
	var f [14]string
	rest, n := raw, 0
	for ; n < 13; n++ {
		field, more, ok := strings.Cut(rest, sep)
		if !ok {
			break
		}
		f[n], rest = field, more
	}
	if n != 13 {
		return e, fmt.Errorf("%w: %.80q", errNotEntry, raw)
	}
	// A state this release does not know is no entry it reads: taken for
	// PENDING, the key would be taken over and the value written over.
	if !dedupe.State(f[0]).Known() {
		return e, fmt.Errorf("%w: state %.20q", errNotEntry, f[0])
	}
	f[13] = rest
	var ints [13]int64
	for i := 6; i < 13; i++ {
		if ints[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
			return e, fmt.Errorf("stored entry field %d: %w", i+1, err)
		}
	}
	e.State, e.Fingerprint, e.RulesDigest = dedupe.State(f[0]), f[1], f[2]
	e.Owner = dedupe.Owner{Holder: f[3], Source: f[4]}
	e.FirstSource = f[5]
	e.Intent = dedupe.Intent{Partition: int32(ints[6]), Floor: ints[7]}
	e.Result = dedupe.ResultRef{Partition: int32(ints[8]), Offset: ints[9]}
	e.WindowStart = time.UnixMilli(ints[10])
	if ints[11] > 0 {
		e.LeaseUntil = time.UnixMilli(ints[11])
	}
	e.ExpiresAt = time.UnixMilli(ints[12])
	e.Key = f[13]
	return e, nil
}

// newEntry rebuilds the entry that decide.lua created for r at now (the
// script does not send it back), as the store keeps it: times in
// milliseconds.
func newEntry(r dedupe.DecideRequest, now time.Time) dedupe.Entry {
	clock := now
	if !r.EventTime.IsZero() {
		clock = time.UnixMilli(r.EventTime.UnixMilli())
	}
	r.Lease, r.Window = r.Lease.Truncate(time.Millisecond), r.Window.Truncate(time.Millisecond)
	e := decide.NewEntry(r, clock, now)
	e.Now = now
	return e
}

// appendEntry appends a new entry in the store's format: entry.lua's
// encode() in Go, both must write the same bytes.
func (s *Store) appendEntry(b []byte, e *dedupe.Entry) []byte {
	if s.compact {
		return appendCompact(b, e)
	}
	return appendTextEntry(b, e)
}

// appendEntryOver appends e, read as was (a stored value), to be written
// over it: compact when the store writes compact entries, or when was is
// one and e holds a hash this reader did not resolve (readContext),
// which a text entry would keep as it reads.
func (s *Store) appendEntryOver(b []byte, e *dedupe.Entry, was any) []byte {
	if raw, ok := was.(string); s.compact || ok && isCompact(raw) && unresolved(e) {
		return appendCompact(b, e)
	}
	return appendTextEntry(b, e)
}

// unresolved reports whether e holds a hash its reader could not resolve
// (compact.go): a text entry would keep it as it reads. An entry without
// one is written as text by a store that writes text, so that compact
// entries end once no store writes them.
func unresolved(e *dedupe.Entry) bool {
	return hashForm(e.Owner.Holder) || unresolvedRules(e.RulesDigest) ||
		unresolvedSource(e.Owner.Source) || unresolvedSource(e.FirstSource)
}

// unresolvedRules reports whether d is a rules digest in the form its
// reader could not resolve: "sha256:" and the 16 hex digits of the 8
// bytes a compact entry keeps.
func unresolvedRules(d string) bool { return len(d) == 23 && isDigest(d, 16) }

func unresolvedSource(s string) bool {
	topic, _, _, ok := splitSource(s)
	return ok && hashForm(topic)
}

// isCompact reports whether a stored value is a compact entry: a text
// entry starts with its state's name.
func isCompact(raw string) bool { return raw != "" && raw[0] < ' ' }

// scriptFormat is the scripts' argument for the format they write.
func (s *Store) scriptFormat() string {
	if s.compact {
		return "c"
	}
	return "t"
}

// appendTextEntry appends e as a text entry.
func appendTextEntry(b []byte, e *dedupe.Entry) []byte {
	var lease int64
	if !e.LeaseUntil.IsZero() {
		lease = e.LeaseUntil.UnixMilli()
	}
	b = append(b, e.State...)
	for _, f := range [...]string{e.Fingerprint, e.RulesDigest, e.Owner.Holder, e.Owner.Source, e.FirstSource} {
		b = append(append(b, sep...), f...)
	}
	for _, n := range [...]int64{int64(e.Intent.Partition), e.Intent.Floor, int64(e.Result.Partition), e.Result.Offset,
		e.WindowStart.UnixMilli(), lease, e.ExpiresAt.UnixMilli()} {
		b = strconv.AppendInt(append(b, sep...), n, 10)
	}
	return append(append(b, sep...), e.Key...)
}

// checkFields refuses values that would corrupt the entry encoding.
func checkFields(r dedupe.DecideRequest) error {
	for _, v := range [...]string{r.Fingerprint, r.RulesDigest, r.Owner.Holder, r.Owner.Source} {
		if strings.Contains(v, sep) {
			return fmt.Errorf("decide %q: fingerprint, rules digest, holder and source must not contain \\x1f", r.Key)
		}
	}
	return nil
}
