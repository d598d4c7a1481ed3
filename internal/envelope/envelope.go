package envelope

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

func withHeaders(in []dedupe.Header, extra ...dedupe.Header) []dedupe.Header {
	out := make([]dedupe.Header, 0, len(in)+len(extra))
	out = append(out, in...)
	return append(out, extra...)
}

func header(k, v string) dedupe.Header { return dedupe.Header{Key: k, Value: []byte(v)} }

// ResultKey is the key of a result record: the input record's key, or the
// idempotency key when the input has none.
func ResultKey(rec *dedupe.Record, idemKey string) []byte {
	if len(rec.Key) > 0 {
		return rec.Key
	}
	return []byte(idemKey)
}

// Result builds the result record of a first copy: the handler's value,
// the input headers, and the idemstream headers of docs/design.md. source
// is rec.Source() and decision the entry's DecisionID, which the caller
// has already made.
func Result(topic string, partition int, rec *dedupe.Record, o *dedupe.Outcome, source, decision string, value []byte, extra []dedupe.Header) sinks.Message {
	// One result per first copy: its headers and their values are
	// allocated once each, not once per header.
	hs := make([]dedupe.Header, 0, len(rec.Headers)+len(extra)+6) // room for idemstream-pipeline
	hs = append(append(hs, rec.Headers...), extra...)
	vals := make([]byte, 0, len(o.Key)+len(o.Fingerprint)+len(source)+len(dedupe.OutcomeFirst)+len(decision))
	for _, h := range [...]struct{ k, v string }{
		{sinks.HeaderKey, o.Key},
		{sinks.HeaderFingerprint, o.Fingerprint},
		{sinks.HeaderSource, source},
		{sinks.HeaderOutcome, string(dedupe.OutcomeFirst)},
		{sinks.HeaderDecision, decision},
	} {
		start := len(vals)
		vals = append(vals, h.v...)
		hs = append(hs, dedupe.Header{Key: h.k, Value: vals[start:len(vals):len(vals)]})
	}
	return sinks.Message{Topic: topic, Partition: partition, Key: ResultKey(rec, o.Key), Value: value, Headers: hs}
}

// DeadLetter builds the dead-letter record of a rejected record: its key,
// value and headers byte for byte, plus the reason and the evidence.
func DeadLetter(topic string, rec *dedupe.Record, o *dedupe.Outcome, reason dedupe.Reason, cause error, conflictPaths []string) sinks.Message {
	msg := "rejected"
	if cause != nil {
		msg = oneLine(cause.Error())
	}
	hs := withHeaders(rec.Headers,
		header(sinks.HeaderReason, string(reason)),
		header(sinks.HeaderError, msg),
		header(sinks.HeaderSource, rec.Source()))
	if o.Key != "" {
		hs = append(hs, header(sinks.HeaderKey, o.Key))
	}
	if o.Fingerprint != "" {
		hs = append(hs, header(sinks.HeaderFingerprint, o.Fingerprint))
	}
	var se *dedupe.SchemaError
	if errors.As(cause, &se) {
		hs = append(hs, header(sinks.HeaderSchemaID, strconv.Itoa(se.ID)))
		if se.Subject != "" {
			hs = append(hs, header(sinks.HeaderSchemaSubject, se.Subject), header(sinks.HeaderSchemaVersion, strconv.Itoa(se.Version)))
		}
	}
	if reason == dedupe.ReasonConflict {
		hs = append(hs,
			header(sinks.HeaderFirstFingerprint, o.Decision.Entry.Fingerprint),
			header(sinks.HeaderFirstSource, o.Decision.Entry.FirstSource))
		if len(conflictPaths) > 0 {
			hs = append(hs, header(sinks.HeaderConflictPaths, strings.Join(conflictPaths, ",")))
		}
	}
	return sinks.Message{Topic: topic, Partition: -1, Key: rec.Key, Value: rec.Value, Headers: hs}
}

// TrimDeadLetter returns a copy of the dead letter m that carries at most
// keep bytes of its payload, for a broker that refused m for its size (a
// command that arrived compressed can be far larger than a record the
// broker takes uncompressed, and the idemstream headers add to it). The
// reason, the source and the fingerprint stay; idemstream-error says what
// was cut, and idemstream-payload-size how large the payload was. With
// bare set, the input's key and headers go too: only the idemstream
// headers are left, each cut to 4 KiB (a handler's error can be long), for
// a record whose headers alone are too large. The input record itself
// stays where it is, at idemstream-source.
func TrimDeadLetter(m sinks.Message, keep int, bare bool) sinks.Message {
	const maxBareHeader = 4 << 10
	// A dead letter trimmed before keeps the size of the payload it came
	// with.
	size := len(m.Value)
	if v, ok := sinks.HeaderValue(m.Headers, sinks.HeaderPayloadSize); ok {
		if n, err := strconv.Atoi(v); err == nil {
			size = n
		}
	}
	keep = max(min(keep, len(m.Value)), 0)
	out := sinks.Message{Topic: m.Topic, Partition: m.Partition, Key: m.Key, Value: m.Value[:keep:keep]}
	if m.Value == nil {
		out.Value = nil
	}
	cut := fmt.Sprintf("the dead letter was too large for the topic and carries %d of the payload's %d bytes", keep, size)
	if bare {
		out.Key = nil
		cut += ", without the input's key and headers"
	}
	cut += "; the whole record is at idemstream-source"
	hs := make([]dedupe.Header, 0, len(m.Headers)+1)
	for _, h := range m.Headers {
		isOurs := strings.HasPrefix(h.Key, "idemstream-")
		switch {
		case h.Key == sinks.HeaderPayloadSize:
			continue
		case h.Key == sinks.HeaderError:
			first, _, _ := strings.Cut(string(h.Value), " (the dead letter was too large")
			if bare && len(first) > maxBareHeader {
				first = strings.ToValidUTF8(first[:maxBareHeader], "") + "…"
			}
			h = header(sinks.HeaderError, first+" ("+cut+")")
		case bare && !isOurs:
			continue
		case bare && len(h.Value) > maxBareHeader:
			// Evidence of our own that could be long (the conflict's
			// paths): cut, so that a bare dead letter always fits.
			h = dedupe.Header{Key: h.Key, Value: append(h.Value[:maxBareHeader:maxBareHeader], "…"...)}
		}
		hs = append(hs, h)
	}
	out.Headers = append(hs, header(sinks.HeaderPayloadSize, strconv.Itoa(size)))
	return out
}

// Reply builds the replayed copy of a stored result for a replay.
func Reply(topic string, stored sinks.Message, replay *dedupe.Record) sinks.Message {
	hs := make([]dedupe.Header, 0, len(stored.Headers)+2)
	for _, h := range stored.Headers {
		if h.Key != sinks.HeaderSource && h.Key != sinks.HeaderReplayed {
			hs = append(hs, h)
		}
	}
	hs = append(hs, header(sinks.HeaderReplayed, "true"), header(sinks.HeaderSource, replay.Source()))
	return sinks.Message{Topic: topic, Partition: -1, Key: stored.Key, Value: stored.Value, Headers: hs}
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
