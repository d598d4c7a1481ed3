package sinks

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/idemstream/idemstream/dedupe"
)

// Message is one record to write. Partition is chosen by the writer from
// the key (the same murmur2 hash Java clients use) unless Partition >= 0.
type Message struct {
	Topic     string
	Partition int
	Key       []byte
	Value     []byte
	Headers   []dedupe.Header
}

// Written is where a message landed.
type Written struct {
	Partition int
	Offset    int64
	// Err is why the message was not acknowledged (Offset is then
	// dedupe.NoPosition); nil once it was.
	Err error
}

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
// the input headers, and the idemstream headers of docs/design.md.
func Result(topic string, partition int, rec *dedupe.Record, o *dedupe.Outcome, value []byte, extra []dedupe.Header) Message {
	// One result per first copy: its headers and their values are
	// allocated once each, not once per header.
	hs := make([]dedupe.Header, 0, len(rec.Headers)+len(extra)+6) // room for idemstream-pipeline
	hs = append(append(hs, rec.Headers...), extra...)
	source := rec.Source()
	decision := o.Decision.Entry.DecisionID()
	vals := make([]byte, 0, len(o.Key)+len(o.Fingerprint)+len(source)+len(dedupe.OutcomeFirst)+len(decision))
	for _, h := range [...]struct{ k, v string }{
		{HeaderKey, o.Key},
		{HeaderFingerprint, o.Fingerprint},
		{HeaderSource, source},
		{HeaderOutcome, string(dedupe.OutcomeFirst)},
		{HeaderDecision, decision},
	} {
		start := len(vals)
		vals = append(vals, h.v...)
		hs = append(hs, dedupe.Header{Key: h.k, Value: vals[start:len(vals):len(vals)]})
	}
	return Message{Topic: topic, Partition: partition, Key: ResultKey(rec, o.Key), Value: value, Headers: hs}
}

// DeadLetter builds the dead-letter record of a rejected record: its key,
// value and headers byte for byte, plus the reason and the evidence.
func DeadLetter(topic string, rec *dedupe.Record, o *dedupe.Outcome, reason dedupe.Reason, cause error, conflictPaths []string) Message {
	msg := "rejected"
	if cause != nil {
		msg = oneLine(cause.Error())
	}
	hs := withHeaders(rec.Headers,
		header(HeaderReason, string(reason)),
		header(HeaderError, msg),
		header(HeaderSource, rec.Source()))
	if o.Key != "" {
		hs = append(hs, header(HeaderKey, o.Key))
	}
	if o.Fingerprint != "" {
		hs = append(hs, header(HeaderFingerprint, o.Fingerprint))
	}
	if reason == dedupe.ReasonConflict {
		hs = append(hs,
			header(HeaderFirstFingerprint, o.Decision.Entry.Fingerprint),
			header(HeaderFirstSource, o.Decision.Entry.FirstSource))
		if len(conflictPaths) > 0 {
			hs = append(hs, header(HeaderConflictPaths, strings.Join(conflictPaths, ",")))
		}
	}
	return Message{Topic: topic, Partition: -1, Key: rec.Key, Value: rec.Value, Headers: hs}
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
func TrimDeadLetter(m Message, keep int, bare bool) Message {
	const maxBareHeader = 4 << 10
	// A dead letter trimmed before keeps the size of the payload it came
	// with.
	size := len(m.Value)
	if v, ok := HeaderValue(m.Headers, HeaderPayloadSize); ok {
		if n, err := strconv.Atoi(v); err == nil {
			size = n
		}
	}
	keep = max(min(keep, len(m.Value)), 0)
	out := Message{Topic: m.Topic, Partition: m.Partition, Key: m.Key, Value: m.Value[:keep:keep]}
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
		case h.Key == HeaderPayloadSize:
			continue
		case h.Key == HeaderError:
			first, _, _ := strings.Cut(string(h.Value), " (the dead letter was too large")
			if bare && len(first) > maxBareHeader {
				first = strings.ToValidUTF8(first[:maxBareHeader], "") + "…"
			}
			h = header(HeaderError, first+" ("+cut+")")
		case bare && !isOurs:
			continue
		case bare && len(h.Value) > maxBareHeader:
			// Evidence of our own that could be long (the conflict's
			// paths): cut, so that a bare dead letter always fits.
			h = dedupe.Header{Key: h.Key, Value: append(h.Value[:maxBareHeader:maxBareHeader], "…"...)}
		}
		hs = append(hs, h)
	}
	out.Headers = append(hs, header(HeaderPayloadSize, strconv.Itoa(size)))
	return out
}

// Reply builds the replayed copy of a stored result for a replay.
func Reply(topic string, stored Message, replay *dedupe.Record) Message {
	hs := make([]dedupe.Header, 0, len(stored.Headers)+2)
	for _, h := range stored.Headers {
		if h.Key != HeaderSource && h.Key != HeaderReplayed {
			hs = append(hs, h)
		}
	}
	hs = append(hs, header(HeaderReplayed, "true"), header(HeaderSource, replay.Source()))
	return Message{Topic: topic, Partition: -1, Key: stored.Key, Value: stored.Value, Headers: hs}
}

// HeaderValue returns the value of the last header named key.
func HeaderValue(hs []dedupe.Header, key string) (string, bool) {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == key {
			return string(hs[i].Value), true
		}
	}
	return "", false
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
