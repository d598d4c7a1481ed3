package sinks

import (
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
// the input headers, and the idemstream headers of SPEC.
func Result(topic string, partition int, rec *dedupe.Record, o *dedupe.Outcome, value []byte, extra []dedupe.Header) Message {
	// One result per first copy: its headers and their values are
	// allocated once each, not once per header.
	hs := make([]dedupe.Header, 0, len(rec.Headers)+len(extra)+4)
	hs = append(append(hs, rec.Headers...), extra...)
	source := rec.Source()
	vals := make([]byte, 0, len(o.Key)+len(o.Fingerprint)+len(source)+len(dedupe.OutcomeFirst))
	for _, h := range [...]struct{ k, v string }{
		{HeaderKey, o.Key},
		{HeaderFingerprint, o.Fingerprint},
		{HeaderSource, source},
		{HeaderOutcome, string(dedupe.OutcomeFirst)},
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
