package decode

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemstream/idemstream/dedupe"
)

// Options say what a pipeline's payloads are and where their schemas are.
type Options struct {
	// Format is dedupe.PayloadAvro, PayloadProtobuf or PayloadJSONSchema.
	Format dedupe.PayloadFormat
	// Registry reads the schemas that framed payloads name. Nil with
	// SchemaFile.
	Registry *Registry
	// Subject and Version name the reader schema (Version < 1: the
	// latest, read once when the Decoder opens).
	Subject string
	Version int
	// SchemaFile is a local .avsc or .proto: payloads are then plain Avro
	// or Protobuf of that one schema, without the registry's framing.
	SchemaFile string
	// Message is the Protobuf message's full name ("": the file's first).
	Message string
}

// maxWriters bounds the compiled writer schemas a Decoder keeps: a topic
// whose producers registered more ids than this costs a registry round
// trip per new id, not memory without end.
const maxWriters = 4096

// Decoder reads one pipeline's payloads as JSON text. It is safe for
// concurrent use; it implements dedupe.Decoder.
type Decoder struct {
	opts  Options
	local *writer // SchemaFile's: the reader itself
	// state is the reader schema in force and what was compiled against
	// it. A writer schema newer than the reader, under the reader's
	// subject, makes a new state (the subject's latest) replace it.
	state   atomic.Pointer[readerState]
	refresh sync.Mutex
}

// readerState is one reader schema, its digest and the writer schemas
// compiled against it: a new reader schema starts from an empty cache.
type readerState struct {
	reader  readerSchema
	digest  string
	mu      sync.RWMutex
	writers map[int]*writer
}

type readerSchema struct {
	ref   dedupe.SchemaError // coordinates, Err unused
	avro  *avroSchema
	proto *protoSchema
	msg   protoreflect.MessageDescriptor
}

// writer is what a Decoder compiled for one writer schema id, or why it
// cannot read it (an incompatible schema is the same answer every time).
type writer struct {
	ref  dedupe.SchemaError
	err  error
	avro *avroProg
	// Protobuf: the writer's file, and per message-index path the reader
	// message that reads it.
	proto    *protoSchema
	protoMu  sync.Mutex
	messages map[string]protoChoice
	json     *jsonschema.Schema
}

type protoChoice struct {
	md  protoreflect.MessageDescriptor
	err error
}

// Open reads the reader schema (from the registry, or SchemaFile) and
// returns a Decoder. An error wrapping dedupe.ErrRegistryUnavailable may
// pass: the caller waits and opens again.
func Open(ctx context.Context, o Options) (*Decoder, error) {
	d := &Decoder{opts: o}
	switch o.Format {
	case dedupe.PayloadAvro, dedupe.PayloadProtobuf, dedupe.PayloadJSONSchema:
	default:
		return nil, fmt.Errorf("payload %q is not read through a schema", o.Format)
	}
	st := &readerState{writers: map[int]*writer{}}
	var err error
	if o.SchemaFile != "" {
		err = d.openFile(st)
	} else {
		err = d.openRegistry(ctx, st)
	}
	if err != nil {
		return nil, err
	}
	st.digest = st.readerDigest(o.Format)
	d.state.Store(st)
	return d, nil
}

func (d *Decoder) openFile(st *readerState) error {
	o := d.opts
	text, err := os.ReadFile(o.SchemaFile)
	if err != nil {
		return fmt.Errorf("schema_file: %w", err)
	}
	w := &writer{ref: dedupe.SchemaError{Subject: o.SchemaFile}}
	switch o.Format {
	case dedupe.PayloadAvro:
		if st.reader.avro, err = newAvroParser().parse(string(text)); err != nil {
			return fmt.Errorf("schema_file %s: %w", o.SchemaFile, err)
		}
		if w.avro, err = compileAvro(st.reader.avro, st.reader.avro); err != nil {
			return fmt.Errorf("schema_file %s: %w", o.SchemaFile, err)
		}
	case dedupe.PayloadProtobuf:
		if st.reader.proto, err = compileProtoFile(o.SchemaFile, string(text)); err != nil {
			return fmt.Errorf("schema_file %s: %w", o.SchemaFile, err)
		}
		if err := st.pickReaderMessage(o.Message); err != nil {
			return err
		}
	default:
		return fmt.Errorf("schema_file: payload %s is always framed by a registry", o.Format)
	}
	d.local = w
	return nil
}

func (d *Decoder) openRegistry(ctx context.Context, st *readerState) error {
	o := d.opts
	if o.Registry == nil {
		return errors.New("payload " + string(o.Format) + " needs schema_registry or schema_file")
	}
	if o.Format == dedupe.PayloadJSONSchema {
		// The registry's JSON Schema validates; the payload is the JSON
		// itself, so there is no reader schema to resolve to.
		return nil
	}
	version := o.Version
	if version < 1 {
		version = -1
	}
	s, err := o.Registry.subjectSchema(ctx, o.Subject, version)
	if errors.Is(err, dedupe.ErrUnknownSchema) {
		return fmt.Errorf("reader_schema: the registry has no subject %q version %s", o.Subject, versionText(version))
	}
	if err != nil {
		return err
	}
	st.reader.ref = dedupe.SchemaError{ID: s.ID, Subject: s.Subject, Version: s.Version}
	sources, order := map[string]string{}, []string{}
	if err := o.Registry.sources(ctx, s.References, sources, &order, 0); err != nil {
		return fmt.Errorf("reader_schema %s version %d: %w", s.Subject, s.Version, err)
	}
	if err := st.compileReader(o, s.Schema, sources, order); err != nil {
		return fmt.Errorf("reader_schema %s version %d: %w", s.Subject, s.Version, err)
	}
	return nil
}

func (st *readerState) compileReader(o Options, s sr.Schema, sources map[string]string, order []string) error {
	var err error
	switch o.Format {
	case dedupe.PayloadAvro:
		if s.Type != sr.TypeAvro {
			return fmt.Errorf("is a %s schema, not avro", s.Type)
		}
		st.reader.avro, err = parseAvroWithRefs(s.Schema, sources, order)
		return err
	default:
		if s.Type != sr.TypeProtobuf {
			return fmt.Errorf("is a %s schema, not protobuf", s.Type)
		}
		sources[readerFile] = s.Schema
		if st.reader.proto, err = compileProto(readerFile, sources); err != nil {
			return err
		}
		return st.pickReaderMessage(o.Message)
	}
}

// readerFile and writerFile are the names a registry's main .proto text
// is compiled under (its references keep the names they are imported by).
const (
	readerFile = "idemstream-reader.proto"
	writerFile = "idemstream-writer.proto"
)

func (st *readerState) pickReaderMessage(name string) error {
	if name == "" {
		md, err := st.reader.proto.messageByIndexes(nil)
		if err != nil {
			return fmt.Errorf("the reader schema has no message")
		}
		st.reader.msg = md
		return nil
	}
	md, ok := st.reader.proto.messageByName(protoreflect.FullName(name))
	if !ok {
		return fmt.Errorf("reader_schema: no message %s", name)
	}
	st.reader.msg = md
	return nil
}

func parseAvroWithRefs(text string, sources map[string]string, order []string) (*avroSchema, error) {
	p := newAvroParser()
	for _, name := range order {
		if _, err := p.parse(sources[name]); err != nil {
			return nil, fmt.Errorf("reference %s: %w", name, err)
		}
	}
	return p.parse(text)
}

// readerDigest names the reader schema by content, so that a new reader
// schema is a change of rules.
func (st *readerState) readerDigest(format dedupe.PayloadFormat) string {
	var b bytes.Buffer
	b.WriteString(string(format) + ":")
	switch {
	case st.reader.avro != nil:
		st.reader.avro.describe(&b, map[*avroSchema]bool{})
	case st.reader.msg != nil:
		b.WriteString(protoDigest(st.reader.msg))
	}
	sum := sha256.Sum256(b.Bytes())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Digest identifies the reader schema in force; it joins the pipeline's
// rules digest.
func (d *Decoder) Digest() string { return d.state.Load().digest }

// Reader names the reader schema's coordinates (zero for a local file or
// JSON Schema payloads).
func (d *Decoder) Reader() (id int, subject string, version int) {
	r := d.state.Load().reader.ref
	return r.ID, r.Subject, r.Version
}

// AppendJSON appends value, decoded, to dst as JSON text. Its errors are
// classified by dedupe.Classify: poison (malformed_payload,
// unknown_schema, incompatible_schema, invalid_schema,
// non_finite_number, each a *dedupe.SchemaError with the coordinates) or
// retryable (the registry did not answer).
func (d *Decoder) AppendJSON(dst, value []byte) ([]byte, error) {
	st := d.state.Load()
	if d.local != nil {
		return st.decodeWith(dst, d.local, value, false)
	}
	if len(value) < 5 || value[0] != 0 {
		return dst, fmt.Errorf("%w: no schema registry framing (a 0 byte and a 4-byte schema id) before the %s value", dedupe.ErrMalformedPayload, d.opts.Format)
	}
	id := int(binary.BigEndian.Uint32(value[1:5]))
	st, w, err := d.writer(st, id)
	if err != nil {
		if dedupe.Classify(err) != dedupe.Poison {
			return dst, err
		}
		return dst, &dedupe.SchemaError{ID: id, Err: err}
	}
	return st.decodeWith(dst, w, value[5:], true)
}

// SchemaOf names the writer schema value was decoded with, for the dead
// letter of a value that decoded but whose JSON the canonicalizer refuses
// (a JSON Schema payload naming a member twice); ok is false when that
// schema is not known here (not yet fetched, or evicted since).
func (d *Decoder) SchemaOf(value []byte) (ref dedupe.SchemaError, ok bool) {
	if d.local != nil {
		return d.local.ref, true
	}
	if len(value) < 5 || value[0] != 0 {
		return ref, false
	}
	st := d.state.Load()
	st.mu.RLock()
	w := st.writers[int(binary.BigEndian.Uint32(value[1:5]))]
	st.mu.RUnlock()
	if w == nil {
		return ref, false
	}
	return w.ref, true
}

// AppendCanonical appends the canonical form of an Avro value under the
// rules, written in the one walk over its bytes (see avro_canonical.go);
// it implements dedupe.CanonicalAppender. It declines (ok false) any
// payload it cannot write that way, for the canonicalizer to decode with
// AppendJSON: Protobuf and JSON Schema payloads, writer schemas not yet
// compiled or that failed, and every record that does not decode.
func (d *Decoder) AppendCanonical(dst, value []byte, rules *dedupe.PathRules) ([]byte, bool) {
	if d.opts.Format != dedupe.PayloadAvro {
		return dst, false
	}
	st := d.state.Load()
	w, body := d.local, value
	if w == nil {
		if len(value) < 5 || value[0] != 0 {
			return dst, false
		}
		st.mu.RLock()
		w = st.writers[int(binary.BigEndian.Uint32(value[1:5]))]
		st.mu.RUnlock()
		body = value[5:]
	}
	if w == nil || w.err != nil || w.avro == nil {
		return dst, false
	}
	out, ok := appendAvroCanonical(dst, w.avro, body, rules)
	if !ok {
		return dst, false
	}
	return out, true
}

func (st *readerState) decodeWith(dst []byte, w *writer, body []byte, framed bool) ([]byte, error) {
	if w.err != nil {
		return dst, fail(w, w.err)
	}
	var out []byte
	var err error
	switch {
	case w.avro != nil:
		out, err = appendAvroJSON(dst, w.avro, body)
	case w.json != nil:
		out, err = validateJSON(dst, w.json, body)
	default:
		out, err = st.appendProto(dst, w, body, framed)
	}
	if err != nil {
		return dst, fail(w, err)
	}
	return out, nil
}

func fail(w *writer, err error) error {
	e := w.ref
	e.Err = err
	return &e
}

func (st *readerState) appendProto(dst []byte, w *writer, body []byte, framed bool) ([]byte, error) {
	if !framed {
		return appendProtoJSON(dst, st.reader.msg, body)
	}
	var key string
	var indexes []int
	if len(body) > 0 && body[0] == 0 {
		body = body[1:]
	} else {
		var err error
		if indexes, body, err = (&sr.ConfluentHeader{}).DecodeIndex(body, 64); err != nil {
			return dst, fmt.Errorf("%w: protobuf message indexes do not decode: %v", dedupe.ErrMalformedPayload, err)
		}
		key = fmt.Sprint(indexes)
	}
	md, err := w.readerMessage(key, indexes, st.reader.msg)
	if err != nil {
		return dst, err
	}
	return appendProtoJSON(dst, md, body)
}

// readerMessage checks that the writer's message at indexes is the
// pipeline's message (by full name: a topic that carries several message
// types must not have one type's command pass as a replay of another's),
// field by field, once.
func (w *writer) readerMessage(key string, indexes []int, reader protoreflect.MessageDescriptor) (protoreflect.MessageDescriptor, error) {
	w.protoMu.Lock()
	defer w.protoMu.Unlock()
	if c, ok := w.messages[key]; ok {
		return c.md, c.err
	}
	var c protoChoice
	wm, err := w.proto.messageByIndexes(indexes)
	switch {
	case err != nil:
		c.err = err
	case wm.FullName() != reader.FullName():
		c.err = fmt.Errorf("%w: the record is a %s, the pipeline reads %s", dedupe.ErrIncompatibleSchema, wm.FullName(), reader.FullName())
	default:
		if c.err = checkProtoCompatible(wm, reader); c.err == nil {
			c.md = reader
		}
	}
	if len(w.messages) < 64 {
		w.messages[key] = c
	}
	return c.md, c.err
}

// writer returns the compiled writer schema id names, reading it from the
// registry the first time, and the reader state it was compiled against.
// A writer schema newer than the reader under the reader's subject (with
// reader_schema.version latest) first makes the subject's latest version
// the reader schema: a rules change, so that a field only the new version
// has is compared too.
func (d *Decoder) writer(st *readerState, id int) (*readerState, *writer, error) {
	st.mu.RLock()
	w, ok := st.writers[id]
	st.mu.RUnlock()
	if ok {
		return st, w, nil
	}
	ctx := context.Background()
	s, ref, err := d.opts.Registry.byID(ctx, id, st.reader.ref.Subject)
	if err != nil {
		// Not cached: a registry that answers later, or an id registered
		// a moment after the record was written, is read next time.
		return st, nil, err
	}
	if d.newerThanReader(st, ref) {
		if st, err = d.refreshReader(ctx, st); err != nil {
			return st, nil, err
		}
	}
	w = &writer{ref: ref, messages: map[string]protoChoice{}}
	w.err = d.compileWriter(ctx, st, w, s)
	if w.err != nil && dedupe.Classify(w.err) != dedupe.Poison {
		// Only an answer about the schema itself is kept: an outage or a
		// refusal is asked again.
		return st, nil, w.err
	}
	st.mu.Lock()
	if len(st.writers) >= maxWriters {
		for k := range st.writers {
			delete(st.writers, k)
			break
		}
	}
	st.writers[id] = w
	st.mu.Unlock()
	return st, w, nil
}

func (d *Decoder) newerThanReader(st *readerState, ref dedupe.SchemaError) bool {
	r := st.reader.ref
	return d.opts.Version < 1 && r.Subject != "" && ref.Subject == r.Subject && ref.Version > r.Version
}

// refreshReader reads the reader subject's latest version and, when it is
// newer, makes it the reader schema. One refresh at a time: the others
// wait for it and use its result.
func (d *Decoder) refreshReader(ctx context.Context, seen *readerState) (*readerState, error) {
	d.refresh.Lock()
	defer d.refresh.Unlock()
	if cur := d.state.Load(); cur != seen {
		return cur, nil
	}
	next := &readerState{writers: map[int]*writer{}}
	if err := d.openRegistry(ctx, next); err != nil {
		if dedupe.Classify(err) == dedupe.Retryable {
			return seen, err
		}
		// A latest version that cannot serve as the reader (it does not
		// compile, it is another type) keeps the reader in force: the
		// records say what they need through their own reasons.
		return seen, nil
	}
	if next.reader.ref.Version <= seen.reader.ref.Version || !readsOld(seen, next) {
		return seen, nil
	}
	next.digest = next.readerDigest(d.opts.Format)
	d.state.Store(next)
	return next, nil
}

// readsOld reports whether the new reader schema reads what the old one
// did (it is backward compatible with it): only then does it replace it,
// so that a registration that breaks compatibility never turns the
// retries of copies written before into dead letters.
func readsOld(old, next *readerState) bool {
	if old.reader.avro != nil {
		_, err := compileAvro(old.reader.avro, next.reader.avro)
		return err == nil
	}
	return old.reader.msg != nil && next.reader.msg != nil &&
		old.reader.msg.FullName() == next.reader.msg.FullName() && checkProtoCompatible(old.reader.msg, next.reader.msg) == nil
}

func (d *Decoder) compileWriter(ctx context.Context, st *readerState, w *writer, s sr.Schema) error {
	want := map[dedupe.PayloadFormat]sr.SchemaType{dedupe.PayloadAvro: sr.TypeAvro, dedupe.PayloadProtobuf: sr.TypeProtobuf, dedupe.PayloadJSONSchema: sr.TypeJSON}[d.opts.Format]
	if s.Type != want {
		return fmt.Errorf("%w: schema id %d is a %s schema, the pipeline reads %s", dedupe.ErrIncompatibleSchema, w.ref.ID, s.Type, d.opts.Format)
	}
	sources, order := map[string]string{}, []string{}
	if err := d.opts.Registry.sources(ctx, s.References, sources, &order, 0); err != nil {
		if errors.Is(err, dedupe.ErrUnknownSchema) {
			return fmt.Errorf("%w: a reference of schema id %d: %w", dedupe.ErrIncompatibleSchema, w.ref.ID, err)
		}
		return err
	}
	switch d.opts.Format {
	case dedupe.PayloadAvro:
		ws, err := parseAvroWithRefs(s.Schema, sources, order)
		if err != nil {
			return fmt.Errorf("%w: %w", dedupe.ErrIncompatibleSchema, err)
		}
		w.avro, err = compileAvro(ws, st.reader.avro)
		return err
	case dedupe.PayloadProtobuf:
		sources[writerFile] = s.Schema
		var err error
		w.proto, err = compileProto(writerFile, sources)
		return err
	default:
		var err error
		w.json, err = compileJSONSchema(w.ref.ID, s.Schema, sources)
		return err
	}
}

func compileJSONSchema(id int, text string, sources map[string]string) (*jsonschema.Schema, error) {
	c := jsonschema.NewCompiler()
	// The library reads file:// URLs by default: a schema anyone may
	// register must not make this process open its files (and print what
	// it found in dead letters). The draft metaschemas are built in.
	c.UseLoader(registryOnly{})
	// A reference's name is relative to the schema that imports it, so it
	// sits beside the main schema's own URL.
	const base = "registry:///schemas/ids/"
	for name, src := range sources {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(src))
		if err != nil {
			return nil, fmt.Errorf("%w: reference %s is not JSON", dedupe.ErrIncompatibleSchema, name)
		}
		if err := c.AddResource(base+name, doc); err != nil {
			return nil, fmt.Errorf("%w: reference %s: %v", dedupe.ErrIncompatibleSchema, name, err)
		}
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("%w: schema id %d is not JSON", dedupe.ErrIncompatibleSchema, id)
	}
	url := fmt.Sprintf("%s%d", base, id)
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("%w: %v", dedupe.ErrIncompatibleSchema, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("%w: schema id %d does not compile: %v", dedupe.ErrIncompatibleSchema, id, err)
	}
	return s, nil
}

// registryOnly is the JSON Schema loader of a registry's schemas: every
// URL that is not one of the schema's own references is refused.
type registryOnly struct{}

func (registryOnly) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s is not a reference the registry gave", url)
}

// validateJSON checks a JSON Schema payload and appends it unchanged: the
// canonicalizer reads the JSON itself.
func validateJSON(dst []byte, s *jsonschema.Schema, body []byte) ([]byte, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return dst, fmt.Errorf("%w: not JSON: %v", dedupe.ErrMalformedPayload, err)
	}
	if err := s.Validate(doc); err != nil {
		var verr *jsonschema.ValidationError
		if errors.As(err, &verr) {
			return dst, fmt.Errorf("%w: %s", dedupe.ErrInvalidSchema, firstLine(verr.Error()))
		}
		return dst, fmt.Errorf("%w: %v", dedupe.ErrInvalidSchema, err)
	}
	return append(dst, body...), nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
