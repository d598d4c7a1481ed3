package dlq

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/sinks"
)

// HeaderRedriveOf names the dead letter a redriven record was read from
// (dlq-topic/partition/offset). It is the only header a redrive adds.
const HeaderRedriveOf = "idemstream-redrive-of"

// Position is where a record is: topic, partition and offset, spelled
// topic/partition/offset as the idemstream-source header spells it.
type Position struct {
	Topic     string
	Partition int
	Offset    int64
}

// ParsePosition reads topic/partition/offset. A topic name cannot hold a
// slash, so the last two fields are the numbers.
func ParsePosition(s string) (Position, error) {
	rest, off, ok1 := cutLast(s)
	topic, part, ok2 := cutLast(rest)
	if !ok1 || !ok2 || topic == "" {
		return Position{}, fmt.Errorf("%q: want topic/partition/offset", s)
	}
	p, err1 := strconv.Atoi(part)
	o, err2 := strconv.ParseInt(off, 10, 64)
	if err1 != nil || err2 != nil || p < 0 || o < 0 {
		return Position{}, fmt.Errorf("%q: want topic/partition/offset with whole numbers", s)
	}
	return Position{Topic: topic, Partition: p, Offset: o}, nil
}

func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// IsZero reports whether p names no record.
func (p Position) IsZero() bool { return p.Topic == "" }

func (p Position) String() string {
	if p.IsZero() {
		return ""
	}
	return p.Topic + "/" + strconv.Itoa(p.Partition) + "/" + strconv.FormatInt(p.Offset, 10)
}

// MarshalJSON writes the topic/partition/offset string ("" for none).
func (p Position) MarshalJSON() ([]byte, error) { return json.Marshal(p.String()) }

// UnmarshalJSON reads a topic/partition/offset string.
func (p *Position) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == "" {
		*p = Position{}
		return nil
	}
	v, err := ParsePosition(s)
	*p = v
	return err
}

// DeadLetter is one record of a dead-letter topic, read apart into the
// input record it carries and the evidence idemstream added to it.
type DeadLetter struct {
	// At is the dead letter's own place in the dead-letter topic, Time its
	// timestamp: when idemstream wrote it.
	At   Position
	Time time.Time
	// Key, Value and Headers are the input record's, byte for byte, as
	// the dead letter carries them (see Trimmed).
	Key     []byte
	Value   []byte
	Headers []dedupe.Header

	// The evidence (sinks.Header*). Reason is "" for a record that
	// idemstream did not write.
	Reason      dedupe.Reason
	Error       string
	Source      Position // the input record, where it was consumed
	IdemKey     string   // the normalized idempotency key, when it could be read
	Fingerprint string
	// FirstFingerprint, FirstSource and ConflictPaths are a conflict's:
	// the stored first copy it differs from, and the JSON Pointers at
	// which it does (none when the first copy could not be read).
	FirstFingerprint string
	FirstSource      Position
	ConflictPaths    []string
	// Trimmed is a dead letter too large for its topic, written with part
	// of its payload (and perhaps without the input's key and headers):
	// PayloadSize is the whole payload's size, and the whole record is
	// at Source.
	Trimmed     bool
	PayloadSize int
	// RedriveOf is set when the input record was itself a redrive: the
	// dead letter it was read from.
	RedriveOf Position
	// Evidence is every header idemstream added, as written.
	Evidence []dedupe.Header
}

// Parse reads a record of a dead-letter topic. A dead letter's headers
// are the input's followed by idemstream's evidence, which starts with
// idemstream-reason: everything before the last idemstream-reason is the
// input's own (an input may carry headers named idemstream-* of an
// upstream pipeline, which stay), everything from it on is the evidence.
// A record with no idemstream-reason is no dead letter of idemstream's:
// its Reason is "" and its headers are all the input's.
func Parse(rec *dedupe.Record) DeadLetter {
	d := DeadLetter{At: Position{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset}, Time: rec.Time,
		Key: rec.Key, Value: rec.Value}
	cut := len(rec.Headers)
	for i := len(rec.Headers) - 1; i >= 0; i-- {
		if rec.Headers[i].Key == sinks.HeaderReason {
			cut = i
			break
		}
	}
	d.Headers, d.Evidence = rec.Headers[:cut:cut], rec.Headers[cut:]
	if v, ok := sinks.HeaderValue(d.Headers, HeaderRedriveOf); ok {
		d.RedriveOf, _ = ParsePosition(v)
	}
	ev := func(name string) string { v, _ := sinks.HeaderValue(d.Evidence, name); return v }
	d.Reason = dedupe.Reason(ev(sinks.HeaderReason))
	d.Error = ev(sinks.HeaderError)
	d.Source, _ = ParsePosition(ev(sinks.HeaderSource))
	d.IdemKey = ev(sinks.HeaderKey)
	d.Fingerprint = ev(sinks.HeaderFingerprint)
	d.FirstFingerprint = ev(sinks.HeaderFirstFingerprint)
	d.FirstSource, _ = ParsePosition(ev(sinks.HeaderFirstSource))
	if paths, ok := sinks.HeaderValue(d.Evidence, sinks.HeaderConflictPaths); ok {
		// "" is the whole payload (a raw payload has no fields).
		d.ConflictPaths = splitPaths(paths)
	}
	if size, ok := sinks.HeaderValue(d.Evidence, sinks.HeaderPayloadSize); ok {
		d.Trimmed = true
		d.PayloadSize, _ = strconv.Atoi(size)
	}
	return d
}

// splitPaths splits idemstream-conflict-paths. The pointers are joined
// with commas, and a pointer may hold one itself ("/a,b"): a piece that
// does not start with "/" continues the one before.
func splitPaths(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if len(out) > 0 && !strings.HasPrefix(p, "/") {
			out[len(out)-1] += "," + p
			continue
		}
		out = append(out, p)
	}
	return out
}

// Redrivable reports whether dead letters of reason may be sent back
// without --force: only a handler's failure can end otherwise the next
// time. A conflict meets the same stored key again, and an invalid record
// the same rules; both come straight back.
func Redrivable(reason dedupe.Reason) bool { return reason == dedupe.ReasonHandlerFailed }

// ErrNotRedrivable is a selection that names a reason Redrivable refuses,
// without Force.
var ErrNotRedrivable = errors.New("would come straight back to the dead-letter topic")

// KnownReason reports whether reason is one idemstream writes.
func KnownReason(reason dedupe.Reason) bool { return slices.Contains(dedupe.Reasons, reason) }

// Original is the record to send back for d: the input's key, value and
// headers, without idemstream-redrive-of (a redrive sets its own).
func (d *DeadLetter) Original() (key, value []byte, headers []dedupe.Header) {
	headers = make([]dedupe.Header, 0, len(d.Headers)+1)
	for _, h := range d.Headers {
		if h.Key != HeaderRedriveOf {
			headers = append(headers, h)
		}
	}
	return d.Key, d.Value, headers
}
