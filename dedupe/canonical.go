package dedupe

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// ErrMalformedPayload is wrapped by every error that rejects a payload as not
// canonicalizable JSON.
var ErrMalformedPayload = errors.New("malformed payload")

// PayloadFormat says how a payload is read before it is fingerprinted.
type PayloadFormat string

const (
	// PayloadJSON payloads are parsed and reduced to their canonical form.
	PayloadJSON PayloadFormat = "json"
	// PayloadRaw payloads are fingerprinted byte for byte.
	PayloadRaw PayloadFormat = "raw"
	// PayloadAvro, PayloadProtobuf and PayloadJSONSchema payloads are read
	// through a schema (a registry's, in its wire format, or a local file)
	// by a Decoder into JSON text, then canonicalized as JSON payloads are.
	PayloadAvro       PayloadFormat = "avro"
	PayloadProtobuf   PayloadFormat = "protobuf"
	PayloadJSONSchema PayloadFormat = "json_schema"
)

// Decoder reads payloads that are not JSON text (Avro, Protobuf) as the
// JSON text the canonicalizer reads. Package decode has the
// implementation; the mapping it follows is part of the fingerprint.
type Decoder interface {
	// AppendJSON appends value, decoded, to dst. Its errors are poison
	// (ReasonOf names the dead letter's reason) or retryable (a schema
	// registry that did not answer): Classify tells them apart.
	AppendJSON(dst, value []byte) ([]byte, error)
	// Digest names what decoding depends on (the reader schema); it joins
	// the rules digest, so a new reader schema is a change of rules.
	Digest() string
}

// SchemaNamer is what a Decoder may also be: it names the writer schema a
// payload was decoded with, for the dead letter of a payload that decoded
// but whose JSON text the canonicalizer refuses.
type SchemaNamer interface {
	SchemaOf(value []byte) (SchemaError, bool)
}

// withSchema wraps err, the canonicalizer's refusal of payload's decoded
// text, with the coordinates of the schema it was decoded with, as the
// decoder's own refusals are.
func (c *Canonicalizer) withSchema(payload []byte, err error) error {
	if err == nil || c.dec == nil || hasSchema(err) {
		return err
	}
	n, ok := c.dec.(SchemaNamer)
	if !ok {
		return err
	}
	ref, ok := n.SchemaOf(payload)
	if !ok {
		return err
	}
	ref.Err = err
	return &ref
}

// hasSchema reports whether err carries a schema's coordinates. Apart
// from withSchema so that its target, which escapes, is made only for an
// error: withSchema runs for every payload.
func hasSchema(err error) bool {
	var se *SchemaError
	return errors.As(err, &se)
}

// CanonicalScheme names the canonicalization algorithm. It is part of every
// rules digest so that a change to the algorithm can never let fingerprints
// computed under the old one be compared with new ones.
const CanonicalScheme = "jcs-v1"

// MaxNestingDepth is the deepest nesting of objects and arrays a JSON payload
// may have. It bounds recursion in the canonicalizer and the size of the path
// state it tracks.
const MaxNestingDepth = 64

// CanonicalRules say what makes two payloads "the same request".
type CanonicalRules struct {
	Payload   PayloadFormat // "" means json
	Volatile  []string      // JSON Pointers, `*` wildcard segments
	Unordered []string
	// Decoder reads avro, protobuf and json_schema payloads; required for
	// those, refused for the others.
	Decoder Decoder
}

// Canonicalizer turns payloads into their canonical form and fingerprint
// under one set of rules. It is immutable after construction and safe for
// concurrent use.
type Canonicalizer struct {
	rules CanonicalRules
	raw   bool
	dec   Decoder // nil for json and raw payloads
	// appender is dec when it writes canonical forms itself, with paths
	// (nil without path rules) for it to apply.
	appender CanonicalAppender
	paths    *PathRules
	match    *canonMatcher // nil when no path rule is configured
	digest   string
	// byReader caches the rules digest of the decoder's current reader
	// schema, which may change while the canonicalizer is in use.
	byReader atomic.Pointer[readerDigest]
}

// NewCanonicalizer validates the rules and compiles their pointers.
func NewCanonicalizer(r CanonicalRules) (*Canonicalizer, error) {
	c := &Canonicalizer{rules: CanonicalRules{
		Payload:   r.Payload,
		Volatile:  slices.Clone(r.Volatile),
		Unordered: slices.Clone(r.Unordered),
		Decoder:   r.Decoder,
	}}
	if r.Decoder != nil && r.Payload != PayloadAvro && r.Payload != PayloadProtobuf && r.Payload != PayloadJSONSchema {
		return nil, fmt.Errorf("payload %q is not read through a schema", r.Payload)
	}
	switch r.Payload {
	case "", PayloadJSON:
		c.rules.Payload = PayloadJSON
	case PayloadRaw:
		c.raw = true
		// A raw payload has no structure to remove paths from; accepting
		// them would let an operator believe a field is ignored while
		// every retry still gets a new fingerprint.
		if len(r.Volatile) > 0 || len(r.Unordered) > 0 {
			return nil, fmt.Errorf("payload %q cannot have volatile or unordered paths", r.Payload)
		}
	case PayloadAvro, PayloadProtobuf, PayloadJSONSchema:
		if r.Decoder == nil {
			return nil, fmt.Errorf("payload %q needs a schema (schema_registry or schema_file)", r.Payload)
		}
		c.dec = r.Decoder
	default:
		return nil, fmt.Errorf("unknown payload format %q (want json, raw, avro, protobuf or json_schema)", r.Payload)
	}

	var vol, unord []Pointer
	for i, s := range r.Volatile {
		p, err := ParsePointer(s)
		if err != nil {
			return nil, fmt.Errorf("volatile[%d]: %w", i, err)
		}
		vol = append(vol, p)
	}
	for i, s := range r.Unordered {
		p, err := ParsePointer(s)
		if err != nil {
			return nil, fmt.Errorf("unordered[%d]: %w", i, err)
		}
		unord = append(unord, p)
	}
	if len(vol)+len(unord) > 0 {
		c.match = compileMatcher(newPathMatcher(vol, unord))
		c.paths = &PathRules{m: c.match}
	}
	c.appender, _ = c.dec.(CanonicalAppender)
	schema := ""
	if c.dec != nil {
		schema = c.dec.Digest()
	}
	c.digest = rulesDigest(c.rules.Payload, schema, r.Volatile, r.Unordered)
	return c, nil
}

// Rules returns a copy of the rules the canonicalizer was built from, with
// an empty payload format spelled out as PayloadJSON.
func (c *Canonicalizer) Rules() CanonicalRules {
	return CanonicalRules{
		Payload:   c.rules.Payload,
		Volatile:  slices.Clone(c.rules.Volatile),
		Unordered: slices.Clone(c.rules.Unordered),
		Decoder:   c.rules.Decoder,
	}
}

// RulesDigest identifies the rules as "sha256:<hex>". Two canonicalizers
// whose rules list the same paths, in any order and with any repetition,
// share a digest; fingerprints are comparable only under equal digests.
// With a Decoder, the digest follows its current reader schema.
func (c *Canonicalizer) RulesDigest() string {
	if c.dec == nil {
		return c.digest
	}
	return c.digestFor(c.dec.Digest())
}

type readerDigest struct{ reader, rules string }

func (c *Canonicalizer) digestFor(reader string) string {
	if p := c.byReader.Load(); p != nil && p.reader == reader {
		return p.rules
	}
	rules := rulesDigest(c.rules.Payload, reader, c.rules.Volatile, c.rules.Unordered)
	c.byReader.Store(&readerDigest{reader: reader, rules: rules})
	return rules
}

// decodeWithDigest decodes payload (see decode) and names the rules digest
// the decoding was made under: the reader schema is read before and after,
// and a decoding that a change of reader schema overtook is made again.
func (c *Canonicalizer) decodeWithDigest(s *canonScratch, payload []byte) ([]byte, string, error) {
	if c.dec == nil {
		return payload, c.digest, nil
	}
	for {
		before := c.dec.Digest()
		js, err := c.decode(s, payload)
		if after := c.dec.Digest(); after == before {
			return js, c.digestFor(before), err
		}
	}
}

// rulesDigest hashes a canonical JSON document describing the rules, so the
// encoding is unambiguous whatever bytes a pointer holds. The reader
// schema's digest is a member only where there is one, so that the digests
// of json and raw rules stay what they were before schemas existed.
func rulesDigest(format PayloadFormat, schema string, volatile, unordered []string) string {
	norm := func(ps []string) []string {
		ps = slices.Clone(ps)
		slices.Sort(ps)
		return slices.Compact(ps)
	}
	list := func(b []byte, ps []string) []byte {
		b = append(b, '[')
		for i, p := range ps {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendQuotedUTF8(b, []byte(p))
		}
		return append(b, ']')
	}
	b := []byte(`{"payload":`)
	b = appendQuotedUTF8(b, []byte(format))
	if schema != "" {
		b = append(b, `,"schema":`...)
		b = appendQuotedUTF8(b, []byte(schema))
	}
	b = append(b, `,"scheme":`...)
	b = appendQuotedUTF8(b, []byte(CanonicalScheme))
	b = append(b, `,"unordered":`...)
	b = list(b, norm(unordered))
	b = append(b, `,"volatile":`...)
	b = list(b, norm(volatile))
	b = append(b, '}')
	return formatSHA256(sha256.Sum256(b))
}

// AppendCanonical appends the canonical form of payload to dst and returns
// the extended buffer; on error it returns dst as it was. A raw payload is
// appended unchanged. Apart from growing dst it allocates nothing once the
// package's pooled scratch has warmed up.
func (c *Canonicalizer) AppendCanonical(dst, payload []byte) ([]byte, error) {
	if c.raw {
		return append(dst, payload...), nil
	}
	s := getScratch()
	if out, _, ok := c.direct(s, payload); ok {
		dst = append(dst, out...)
		putScratch(s)
		return dst, nil
	}
	payload, err := c.decode(s, payload)
	if err == nil {
		var out []byte
		out, err = c.appendCanonical(s, s.out[:0], payload)
		s.out = out
		if err == nil {
			dst = append(dst, out...)
		}
	}
	putScratch(s)
	return dst, err
}

// decode turns a payload read through a schema into JSON text in s.json;
// JSON payloads are returned as they are.
func (c *Canonicalizer) decode(s *canonScratch, payload []byte) ([]byte, error) {
	if c.dec == nil {
		return payload, nil
	}
	js, err := c.dec.AppendJSON(s.json[:0], payload)
	s.json = js
	return js, err
}

// DecodeJSON returns the JSON text the canonicalizer reads for payload: the
// payload itself for JSON, its decoding for avro, protobuf and
// json_schema. It is what a person reads to see what was compared.
func (c *Canonicalizer) DecodeJSON(payload []byte) ([]byte, error) {
	if c.dec == nil || c.raw {
		return payload, nil
	}
	return c.dec.AppendJSON(nil, payload)
}

// Fingerprint returns "sha256:<64 lowercase hex>" over the canonical form of
// payload.
func (c *Canonicalizer) Fingerprint(payload []byte) (string, error) {
	fp, _, err := c.fingerprintWithDigest(payload)
	return fp, err
}

// fingerprintWithDigest is Fingerprint with the rules digest it was made
// under: with a Decoder, reading payload may move the reader schema on.
func (c *Canonicalizer) fingerprintWithDigest(payload []byte) (fp, digest string, err error) {
	if c.raw {
		return formatSHA256(sha256.Sum256(payload)), c.RulesDigest(), nil
	}
	s := getScratch()
	defer putScratch(s)
	if out, digest, ok := c.direct(s, payload); ok {
		return formatSHA256(sha256.Sum256(out)), digest, nil
	}
	text, digest, err := c.decodeWithDigest(s, payload)
	if err != nil {
		return "", digest, err
	}
	fp, err = c.fingerprintText(s, text)
	return fp, digest, err
}

// fingerprintText fingerprints JSON text (a payload already decoded).
func (c *Canonicalizer) fingerprintText(s *canonScratch, text []byte) (string, error) {
	if c.raw {
		return formatSHA256(sha256.Sum256(text)), nil
	}
	out, err := c.appendCanonical(s, s.out[:0], text)
	s.out = out
	if err != nil {
		return "", err
	}
	return formatSHA256(sha256.Sum256(out)), nil
}

func formatSHA256(sum [sha256.Size]byte) string {
	const prefix = "sha256:"
	var buf [len(prefix) + 2*sha256.Size]byte
	copy(buf[:], prefix)
	hex.Encode(buf[len(prefix):], sum[:])
	return string(buf[:])
}

// canonScratch holds everything one canonicalization needs besides its output.
// It is pooled so that a steady stream of payloads of similar size reaches a
// state where canonicalizing allocates nothing.
type canonScratch struct {
	frames  [MaxNestingDepth]canonFrame // the open containers, outermost first
	data    []byte                      // the payload
	members []canonMember               // members of the objects still open, innermost last
	spans   []elemSpan                  // element spans of the unordered arrays still open
	states  []int32                     // active path-matcher states, one run per open level
	names   []byte                      // decoded member names that had escapes
	num     []byte                      // digit buffer for number formatting
	tmp     []byte                      // copy of a container's text while its parts are reordered
	json    []byte                      // a decoded payload's JSON text
	out     []byte                      // the canonical form, until it is hashed or copied to the caller
}

type elemSpan struct{ start, end int }

var scratchPool = sync.Pool{New: func() any { return new(canonScratch) }}

// Buffers above these sizes are dropped rather than pooled, so one huge
// payload does not pin its memory for the life of the process.
const (
	maxPooledBytes = 1 << 20
	maxPooledNodes = 1 << 16
)

func getScratch() *canonScratch { return scratchPool.Get().(*canonScratch) }

func putScratch(s *canonScratch) {
	s.data = nil
	if cap(s.out) > maxPooledBytes {
		s.out = nil
	}
	if cap(s.tmp) > maxPooledBytes {
		s.tmp = nil
	}
	if cap(s.json) > maxPooledBytes {
		s.json = nil
	}
	if cap(s.names) > maxPooledBytes {
		s.names = nil
	}
	if cap(s.num) > maxPooledBytes {
		s.num = nil
	}
	if cap(s.members) > maxPooledNodes {
		s.members = nil
	}
	if cap(s.spans) > maxPooledNodes {
		s.spans = nil
	}
	if cap(s.states) > maxPooledNodes {
		s.states = nil
	}
	scratchPool.Put(s)
}
