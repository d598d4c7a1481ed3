package decode

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idemstream/idemstream/dedupe"
)

// Protobuf payloads become JSON text that the JSON canonicalizer then
// fingerprints. The mapping must be injective under one reader schema:
// two messages that differ as Protobuf values never give the same
// canonical JSON. It is deliberately not protojson's, whose output is
// unstable by design, names members by json_name, writes 64-bit integers
// as strings and leaves implicit defaults out:
//
//   - members are named by the fields' proto names;
//   - implicit-presence fields are always written, their default when
//     absent, because on the wire absent and default are one request;
//     explicit-presence fields (messages, oneof members, `optional`,
//     proto2 fields) only when present; a oneof gives its set member;
//   - 64-bit integers are exact decimal, never floats;
//   - floats and doubles are Go's shortest form that reads back as the
//     same value; NaN and infinities have no JSON form and are refused.
//     -0 is written "-0", which RFC 8785 (and so the canonicalizer) writes
//     as 0: -0 and 0 are one request, as they are in a JSON payload;
//   - an enum is its value's name, or the integer of a number the enum
//     does not declare (an integer never equals a name), closed enums
//     included: treating such a value as unknown, as proto2 does, would
//     make it the same request as the field being absent;
//   - repeated fields and maps are [] and {} even when empty; map keys are
//     their text, and of duplicate keys the last entry wins;
//   - fields the reader does not declare are skipped: they are not
//     compared, so a writer that adds a field still replays an old copy;
//   - groups (proto2, and editions' delimited encoding) are read as the
//     messages they are;
//   - strings must be UTF-8, whatever the schema's utf8_validation says:
//     JSON holds nothing else;
//   - depth is counted as the canonicalizer counts it, in JSON containers
//     (a repeated field or a map is a level, its messages the next), and
//     output deeper than dedupe.MaxNestingDepth is refused as malformed.
//
// Wire semantics follow Protobuf: the last of several occurrences of a
// singular field wins, occurrences of a message field merge, setting
// another member of a oneof clears the previous one. Where the Go runtime
// would file a known field with the wrong wire type away as unknown, this
// refuses it as malformed: the field is in the reader's schema, so dropping
// it would compare two requests without it.

// protoSchema is a compiled .proto schema and the files it imports.
type protoSchema struct {
	file protoreflect.FileDescriptor // the main file
}

// compileProto compiles main, one of the keys of sources, which maps every
// import path to its text. The google/protobuf/*.proto files are always the
// compiler's own copies, so that a registry that sends its own text of
// timestamp.proto does not change what the schema means or its digest.
func compileProto(main string, sources map[string]string) (*protoSchema, error) {
	return compileProtoFrom(main, protocompile.SourceAccessorFromMap(sources))
}

// compileProtoFile compiles a local .proto, text as read from path. An
// import is read from the file's directory or, failing that, the nearest
// directory above it that holds it: "coupon/v1/item.proto" imported by proto/coupon/v1/claim.proto
// is proto/coupon/v1/item.proto, as protoc -I proto reads it.
func compileProtoFile(path, text string) (*protoSchema, error) {
	main := filepath.Base(path)
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	return compileProtoFrom(main, func(name string) (io.ReadCloser, error) {
		if name == main {
			return io.NopCloser(strings.NewReader(text)), nil
		}
		rel := filepath.FromSlash(name)
		if !filepath.IsLocal(rel) {
			return nil, fmt.Errorf("import %q leaves the schema's directories", name)
		}
		for d := dir; ; d = filepath.Dir(d) {
			if f, err := os.Open(filepath.Join(d, rel)); err == nil {
				return f, nil
			}
			if filepath.Dir(d) == d {
				return nil, fmt.Errorf("import %q: %w beside %s or above it", name, fs.ErrNotExist, path)
			}
		}
	})
}

func compileProtoFrom(main string, open func(string) (io.ReadCloser, error)) (*protoSchema, error) {
	src := &protocompile.SourceResolver{Accessor: open}
	std := protocompile.WithStandardImports(protocompile.ResolverFunc(
		func(string) (protocompile.SearchResult, error) {
			return protocompile.SearchResult{}, protoregistry.NotFound
		}))
	c := protocompile.Compiler{Resolver: protocompile.ResolverFunc(
		func(path string) (protocompile.SearchResult, error) {
			if r, err := std.FindFileByPath(path); err == nil {
				return r, nil
			}
			return src.FindFileByPath(path)
		})}
	files, err := c.Compile(context.Background(), main)
	if err != nil {
		return nil, fmt.Errorf("%w: protobuf schema %s does not compile: %v", dedupe.ErrIncompatibleSchema, main, err)
	}
	// The compiler's descriptors resolve features and labels on every call;
	// the runtime's own are precomputed, which the per-record walk needs.
	set := &descriptorpb.FileDescriptorSet{}
	for _, f := range protoFileClosure(files[0]) {
		set.File = append(set.File, protodesc.ToFileDescriptorProto(f))
	}
	reg, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, fmt.Errorf("%w: protobuf schema %s does not build: %v", dedupe.ErrIncompatibleSchema, main, err)
	}
	fd, err := reg.FindFileByPath(main)
	if err != nil {
		return nil, fmt.Errorf("%w: protobuf schema %s does not build: %v", dedupe.ErrIncompatibleSchema, main, err)
	}
	return &protoSchema{file: fd}, nil
}

// protoFileClosure lists f and every file it imports, transitively, each
// once, imports before the files that import them.
func protoFileClosure(f protoreflect.FileDescriptor) []protoreflect.FileDescriptor {
	var out []protoreflect.FileDescriptor
	seen := map[string]bool{}
	var visit func(protoreflect.FileDescriptor)
	visit = func(f protoreflect.FileDescriptor) {
		if seen[f.Path()] {
			return
		}
		seen[f.Path()] = true
		imports := f.Imports()
		for i := range imports.Len() {
			visit(imports.Get(i).FileDescriptor)
		}
		out = append(out, f)
	}
	visit(f)
	return out
}

// messageByIndexes picks the message Confluent's message indexes name:
// indexes[0] a top-level message in declaration order, each next index a
// message nested in the previous one (map entries count, as they do in the
// descriptor Confluent's serializers index). Empty means [0].
func (s *protoSchema) messageByIndexes(indexes []int) (protoreflect.MessageDescriptor, error) {
	msgs := s.file.Messages()
	var md protoreflect.MessageDescriptor
	for i := 0; i == 0 || i < len(indexes); i++ {
		ix := 0
		if len(indexes) > 0 {
			ix = indexes[i]
		}
		if ix < 0 || ix >= msgs.Len() {
			where := "the file " + s.file.Path()
			if md != nil {
				where = "message " + string(md.FullName())
			}
			return nil, fmt.Errorf("%w: message index %d (position %d of %v) is out of range: %s declares %d messages",
				dedupe.ErrMalformedPayload, ix, i, indexes, where, msgs.Len())
		}
		md = msgs.Get(ix)
		msgs = md.Messages()
	}
	return md, nil
}

// messageByName finds a message of the main file, top-level or nested, by
// its full name.
func (s *protoSchema) messageByName(name protoreflect.FullName) (protoreflect.MessageDescriptor, bool) {
	var find func(protoreflect.MessageDescriptors) protoreflect.MessageDescriptor
	find = func(msgs protoreflect.MessageDescriptors) protoreflect.MessageDescriptor {
		for i := range msgs.Len() {
			md := msgs.Get(i)
			if md.FullName() == name {
				return md
			}
			if strings.HasPrefix(string(name), string(md.FullName())+".") {
				if found := find(md.Messages()); found != nil {
					return found
				}
			}
		}
		return nil
	}
	md := find(s.file.Messages())
	return md, md != nil
}

// protoDigestScheme names the mapping of this file: it is hashed into every
// digest, so that fingerprints made under a changed mapping never compare
// with older ones.
const protoDigestScheme = "protobuf-json-v1"

// protoDigest identifies the reader message md and everything its decoding
// depends on: the descriptors of its file and of every file that imports
// transitively, in path order, without source information (comments and
// layout do not change a decoding), and md's full name.
func protoDigest(md protoreflect.MessageDescriptor) string {
	files := protoFileClosure(md.ParentFile())
	slices.SortFunc(files, func(a, b protoreflect.FileDescriptor) int { return strings.Compare(a.Path(), b.Path()) })
	h := sha256.New()
	field := func(b []byte) {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
		h.Write(b)
	}
	field([]byte(protoDigestScheme))
	for _, f := range files {
		fdp := protodesc.ToFileDescriptorProto(f)
		fdp.SourceCodeInfo = nil
		b, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(fdp)
		if err != nil {
			// Not reachable with a descriptor the compiler built; hashing
			// the failure keeps the digest a function of the schema.
			b = []byte(err.Error())
		}
		field([]byte(f.Path()))
		field(b)
	}
	field([]byte(md.FullName()))
	return hex.EncodeToString(h.Sum(nil))
}

// checkProtoCompatible reports a writer message whose fields the reader
// cannot read, by field number, without changing their values. Fields only
// one side has are fine (the reader skips the writer's extra fields). A
// field both have must have the same shape (singular, repeated or map, a
// repeated field read as singular would keep only its last element), the
// same kind or a widening that keeps every value (int32 to int64, uint32
// to uint64 or int64, sint32 to sint64, string to bytes), and for messages
// and enums the same full name. A reader oneof may not join fields that
// the writer sets independently: only the last of them would be read.
func checkProtoCompatible(writer, reader protoreflect.MessageDescriptor) error {
	c := protoCompat{seen: map[[2]protoreflect.FullName]bool{}}
	return c.messages(writer, reader, "")
}

type protoCompat struct {
	seen map[[2]protoreflect.FullName]bool // pairs checked or being checked
}

func (c *protoCompat) messages(w, r protoreflect.MessageDescriptor, path string) error {
	key := [2]protoreflect.FullName{w.FullName(), r.FullName()}
	if c.seen[key] {
		return nil
	}
	c.seen[key] = true
	wf, rf := w.Fields(), r.Fields()
	for i := range wf.Len() {
		wfd := wf.Get(i)
		rfd := rf.ByNumber(wfd.Number())
		if rfd == nil {
			continue
		}
		if err := c.field(wfd, rfd, path+"/"+pbPointerToken(string(rfd.Name()))); err != nil {
			return err
		}
	}
	return c.oneofs(w, r, path)
}

func (c *protoCompat) field(w, r protoreflect.FieldDescriptor, path string) error {
	if ws, rs := pbShape(w), pbShape(r); ws != rs {
		return fmt.Errorf("%w: field %s (number %d) is %s in the writer and %s in the reader",
			dedupe.ErrIncompatibleSchema, path, r.Number(), ws, rs)
	}
	if r.IsMap() {
		if err := c.value(w.MapKey(), r.MapKey(), r.Number(), path, "map key"); err != nil {
			return err
		}
		return c.value(w.MapValue(), r.MapValue(), r.Number(), path+"/*", "map value")
	}
	if r.IsList() {
		return c.value(w, r, r.Number(), path+"/*", "element")
	}
	return c.value(w, r, r.Number(), path, "field")
}

// value compares the types of w and r, which are field num or its map key,
// map value or elements.
func (c *protoCompat) value(w, r protoreflect.FieldDescriptor, num protoreflect.FieldNumber, path, what string) error {
	wk, rk := w.Kind(), r.Kind()
	if wk != rk && !pbWidens(wk, rk) {
		return fmt.Errorf("%w: %s %s (number %d) is %s in the writer and %s in the reader",
			dedupe.ErrIncompatibleSchema, what, path, num, wk, rk)
	}
	switch rk {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if w.Message().FullName() != r.Message().FullName() {
			return fmt.Errorf("%w: %s %s (number %d) is message %s in the writer and %s in the reader",
				dedupe.ErrIncompatibleSchema, what, path, num, w.Message().FullName(), r.Message().FullName())
		}
		return c.messages(w.Message(), r.Message(), path)
	case protoreflect.EnumKind:
		if w.Enum().FullName() != r.Enum().FullName() {
			return fmt.Errorf("%w: %s %s (number %d) is enum %s in the writer and %s in the reader",
				dedupe.ErrIncompatibleSchema, what, path, num, w.Enum().FullName(), r.Enum().FullName())
		}
	}
	return nil
}

// oneofs refuses a reader oneof whose members the writer can set together.
func (c *protoCompat) oneofs(w, r protoreflect.MessageDescriptor, path string) error {
	oneofs := r.Oneofs()
	for i := range oneofs.Len() {
		od := oneofs.Get(i)
		if od.IsSynthetic() {
			continue
		}
		var first protoreflect.FieldDescriptor
		members := od.Fields()
		for j := range members.Len() {
			wfd := w.Fields().ByNumber(members.Get(j).Number())
			if wfd == nil {
				continue
			}
			if first == nil {
				first = wfd
				continue
			}
			wo, fo := wfd.ContainingOneof(), first.ContainingOneof()
			if wo == nil || wo.IsSynthetic() || fo == nil || wo.FullName() != fo.FullName() {
				return fmt.Errorf("%w: oneof %s/%s joins fields %s and %s, which the writer sets independently",
					dedupe.ErrIncompatibleSchema, path, od.Name(), first.Name(), wfd.Name())
			}
		}
	}
	return nil
}

func pbShape(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		return "a map"
	case fd.IsList():
		return "a repeated field"
	}
	return "a singular field"
}

// pbWidens reports a kind change that reads every writer value as the same
// number (or, for string to bytes, the same bytes).
func pbWidens(w, r protoreflect.Kind) bool {
	switch w {
	case protoreflect.Int32Kind:
		return r == protoreflect.Int64Kind
	case protoreflect.Uint32Kind:
		return r == protoreflect.Uint64Kind || r == protoreflect.Int64Kind
	case protoreflect.Sint32Kind:
		return r == protoreflect.Sint64Kind
	case protoreflect.StringKind:
		return r == protoreflect.BytesKind
	}
	return false
}

// pbPointerToken escapes a JSON Pointer reference token.
func pbPointerToken(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// appendProtoJSON decodes data, the Protobuf binary of one message without
// framing, with the reader's descriptor md and appends its JSON text to dst
// (see the mapping at the top of this file). On error dst is returned as
// it was given. The text is bounded (protoLimit), and the text written to
// check occurrences that are then discarded counts against that bound
// too: a record of empty items, or of one item repeated, must not take
// gigabytes. It is safe for concurrent use.
func appendProtoJSON(dst []byte, md protoreflect.MessageDescriptor, data []byte) ([]byte, error) {
	return appendProtoJSONWithin(dst, md, data, protoLimit(md, len(data)))
}

func appendProtoJSONWithin(dst []byte, md protoreflect.MessageDescriptor, data []byte, limit int) ([]byte, error) {
	d := protoDecoders.Get().(*protoDecoder)
	d.data, d.base, d.max = data, len(dst), limit
	d.occ = append(d.occ, protoOcc{end: len(data), wt: protowire.BytesType})
	d.idx = append(d.idx, 0)
	out, err := d.message(dst, md, 0, 1, 1)
	d.release()
	if pe, ok := err.(*protoError); ok {
		return dst, pe.wrap()
	}
	return out, err
}

// protoLimit is the most JSON text a record of n bytes may decode to under
// the reader md: Avro's outputLimit, or what its sparsest items need where
// that is more (proto3 sends no field at its default, so an item of two
// bytes on the wire writes every default of its message), up to
// maxSparseText. A record past it is malformed_payload.
func protoLimit(md protoreflect.MessageDescriptor, n int) int {
	sparse := n*(emptyExpansion(md)/2+64) + 1<<20
	return max(outputLimit(n), min(sparse, maxSparseText))
}

// maxSparseText bounds the text of sparse Protobuf items: 64 MiB, what
// Avro allows a record of 1 MiB (the default max_payload_bytes).
const maxSparseText = 64 << 20

// expansions caches emptyExpansion per reader message.
var expansions sync.Map // protoreflect.MessageDescriptor -> int

// emptyExpansion is the longest text an empty message of any type that md
// reaches (through fields, lists and map values) decodes to.
func emptyExpansion(md protoreflect.MessageDescriptor) int {
	if v, ok := expansions.Load(md); ok {
		return v.(int)
	}
	most := 0
	seen := map[protoreflect.FullName]bool{}
	var visit func(m protoreflect.MessageDescriptor)
	visit = func(m protoreflect.MessageDescriptor) {
		if seen[m.FullName()] {
			return
		}
		seen[m.FullName()] = true
		if out, err := appendProtoJSONWithin(nil, m, nil, math.MaxInt); err == nil {
			most = max(most, len(out))
		}
		fields := m.Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			if fd.IsMap() {
				fd = fd.MapValue()
			}
			if fm := fd.Message(); fm != nil {
				visit(fm)
			}
		}
	}
	visit(md)
	expansions.Store(md, most)
	return most
}

// protoDecoders recycles the decoders' slabs across records.
var protoDecoders = sync.Pool{New: func() any { return new(protoDecoder) }}

// protoOcc is one occurrence of a field on the wire: its value for the
// numeric wire types, its content's bounds in data for length-delimited
// fields and groups.
type protoOcc struct {
	val        uint64
	start, end int
	field      int32 // the field's index in its message
	wt         protowire.Type
}

// protoDecoder walks the wire format guided by the reader's descriptor.
// It first lists the occurrences of a message's known fields, grouped by
// field in wire order, then writes the fields in declaration order: that
// is what the last-wins, merge and oneof rules need, and it costs one more
// pass over the tags. The slabs are stacks: a message pushes its lists and
// pops them when it is written, so nested messages reuse the same memory.
// A message is decoded from a list of segments (positions in idx), the
// occurrences that merge into it; the top-level message is one segment.
type protoDecoder struct {
	data []byte
	// base is where the output starts in its buffer; max bounds the text
	// written, that output and the discarded occurrences' (spent) alike.
	base, max, spent int
	occ              []protoOcc // occurrences, in wire order within each message
	idx              []int      // occurrence indices, grouped by field
	bnd              []int      // per field of each open message, its first position in idx
	ents             []protoEntry
	keys             []byte // text of the map keys of the open maps
	junk             []byte // output of occurrences that are checked and discarded
	// validating counts the discarded occurrences being checked: their
	// values are overwritten, so a NaN in them is no error.
	validating int
}

// protoEntry is a map entry: its key text in keys, its position in idx.
type protoEntry struct {
	ks, ke, pos int
}

// protoFrame records the slab sizes of one open message: its field lists
// are bnd[bnd:] (one more than it has fields), idx[idx:] and occ[occ:].
type protoFrame struct{ occ, idx, bnd int }

func (d *protoDecoder) release() {
	d.data = nil
	if cap(d.occ) > 1<<16 || cap(d.keys) > 1<<20 || cap(d.junk) > 1<<20 {
		return // an outsized record's slabs are not worth keeping
	}
	d.occ, d.idx, d.bnd, d.ents = d.occ[:0], d.idx[:0], d.bnd[:0], d.ents[:0]
	d.keys, d.junk, d.validating, d.spent = d.keys[:0], d.junk[:0], 0, 0
	protoDecoders.Put(d)
}

// bounded fails once the text written passes max: dst (the output, from
// base, or while validating the buffer of a discarded occurrence, from 0)
// and what earlier discarded occurrences wrote.
func (d *protoDecoder) bounded(dst []byte) error {
	written := len(dst) + d.spent
	if d.validating == 0 {
		written -= d.base
	}
	if written > d.max {
		return pbErrorf(dedupe.ErrMalformedPayload, "decodes to more than %d bytes", d.max)
	}
	return nil
}

// bytes is the content of a length-delimited occurrence or group.
func (d *protoDecoder) bytes(o *protoOcc) []byte { return d.data[o.start:o.end] }

func (d *protoDecoder) pop(f protoFrame) {
	d.occ, d.idx, d.bnd = d.occ[:f.occ], d.idx[:f.idx], d.bnd[:f.bnd]
}

// fieldRange is the positions in idx of the occurrences of field i.
func (d *protoDecoder) fieldRange(f protoFrame, i int) (int, int) {
	return d.bnd[f.bnd+i], d.bnd[f.bnd+i+1]
}

// message writes the message made of the segments idx[lo:hi] as a JSON
// object at nesting depth depth (the top-level object is 1).
func (d *protoDecoder) message(dst []byte, md protoreflect.MessageDescriptor, lo, hi, depth int) ([]byte, error) {
	if depth > dedupe.MaxNestingDepth {
		return dst, pbErrorf(dedupe.ErrMalformedPayload, "nesting deeper than %d levels", dedupe.MaxNestingDepth)
	}
	if err := d.bounded(dst); err != nil {
		return dst, err
	}
	f, err := d.scan(md, lo, hi)
	if err != nil {
		return dst, err
	}
	dst = append(dst, '{')
	fields := md.Fields()
	n := 0
	for i := range fields.Len() {
		fd := fields.Get(i)
		if od := fd.ContainingOneof(); od != nil && !od.IsSynthetic() {
			continue
		}
		flo, fhi := d.fieldRange(f, i)
		if flo == fhi && fd.HasPresence() {
			continue
		}
		dst = pbMember(dst, n, fd)
		n++
		switch {
		case fd.IsMap():
			dst, err = d.mapField(dst, fd, flo, fhi, depth+1)
		case fd.IsList():
			dst, err = d.list(dst, fd, flo, fhi, depth+1)
		case flo == fhi:
			dst = pbDefault(dst, fd)
		default:
			dst, err = d.singular(dst, fd, flo, fhi, depth+1)
		}
		if err != nil {
			return dst, pbAt(err, string(fd.Name()))
		}
	}
	oneofs := md.Oneofs()
	for i := range oneofs.Len() {
		if od := oneofs.Get(i); !od.IsSynthetic() {
			if dst, n, err = d.oneof(dst, od, f, n, depth); err != nil {
				return dst, err
			}
		}
	}
	d.pop(f)
	return append(dst, '}'), nil
}

// pbMember writes the name of the n-th member of an object.
func pbMember(dst []byte, n int, fd protoreflect.FieldDescriptor) []byte {
	if n > 0 {
		dst = append(dst, ',')
	}
	// Field names are identifiers: nothing in them needs escaping.
	dst = append(dst, '"')
	dst = append(dst, fd.Name()...)
	return append(dst, '"', ':')
}

// scan lists the occurrences of md's fields in the segments idx[lo:hi] and
// groups them by field. The caller pops the frame it returns.
func (d *protoDecoder) scan(md protoreflect.MessageDescriptor, lo, hi int) (protoFrame, error) {
	f := protoFrame{occ: len(d.occ), idx: len(d.idx), bnd: len(d.bnd)}
	fields := md.Fields()
	for s := lo; s < hi; s++ {
		seg := &d.occ[d.idx[s]]
		if err := d.scanSegment(fields, seg.start, seg.end, md.IsMapEntry()); err != nil {
			d.pop(f)
			return f, err
		}
	}
	// A counting sort by field keeps each field's occurrences in wire
	// order; afterwards field i's are idx[bnd[i]:bnd[i+1]].
	nf, n := fields.Len(), len(d.occ)-f.occ
	d.bnd = slices.Grow(d.bnd, nf+2)[:f.bnd+nf+2]
	b := d.bnd[f.bnd:]
	clear(b)
	for _, o := range d.occ[f.occ:] {
		b[o.field+2]++
	}
	b[0], b[1] = f.idx, f.idx
	for i := 2; i < len(b); i++ {
		b[i] += b[i-1]
	}
	d.idx = slices.Grow(d.idx, n)[:f.idx+n]
	for i, o := range d.occ[f.occ:] {
		d.idx[b[o.field+1]] = f.occ + i
		b[o.field+1]++
	}
	d.bnd = d.bnd[:f.bnd+nf+1]
	return f, nil
}

// scanSegment lists the known fields of data[start:end], a segment of a
// message, or of a map entry when entry is set.
func (d *protoDecoder) scanSegment(fields protoreflect.FieldDescriptors, start, end int, entry bool) error {
	b := d.data[:end]
	next := 0 // encoders write fields in declaration order: try the next one first
	for p := start; p < end; {
		num, wt, n := protowire.ConsumeTag(b[p:])
		if n < 0 || num > protowire.MaxValidNumber {
			return pbErrorf(dedupe.ErrMalformedPayload, "invalid field tag at byte %d", p)
		}
		p += n
		var fd protoreflect.FieldDescriptor
		if next < fields.Len() && fields.Get(next).Number() == num {
			fd = fields.Get(next)
		} else {
			fd = fields.ByNumber(num)
		}
		if fd == nil {
			m := protowire.ConsumeFieldValue(num, wt, b[p:])
			if m < 0 {
				return pbErrorf(dedupe.ErrMalformedPayload, "unknown field %d at byte %d does not decode: %v",
					num, p-n, protowire.ParseError(m))
			}
			p += m
			continue
		}
		if want := pbWireType(fd.Kind()); wt != want && (wt != protowire.BytesType || !fd.IsList() || !pbPackable(fd.Kind())) {
			if entry { // the key and value of a map entry are no members
				return pbErrorf(dedupe.ErrMalformedPayload, "%s map %s has wire type %s, not %s",
					fd.Kind(), fd.Name(), pbWireName(wt), pbWireName(want))
			}
			return pbAt(pbErrorf(dedupe.ErrMalformedPayload, "%s field has wire type %s, not %s",
				fd.Kind(), pbWireName(wt), pbWireName(want)), string(fd.Name()))
		}
		next = fd.Index() + 1
		o := protoOcc{field: int32(fd.Index()), wt: wt}
		var m int
		switch wt {
		case protowire.VarintType:
			o.val, m = protowire.ConsumeVarint(b[p:])
		case protowire.Fixed32Type:
			var v uint32
			v, m = protowire.ConsumeFixed32(b[p:])
			o.val = uint64(v)
		case protowire.Fixed64Type:
			o.val, m = protowire.ConsumeFixed64(b[p:])
		case protowire.BytesType:
			var v []byte
			v, m = protowire.ConsumeBytes(b[p:])
			o.start, o.end = p+m-len(v), p+m
		default: // a group: its content ends before the matching end tag
			var content int
			content, m = pbGroupLen(num, b[p:])
			o.start, o.end = p, p+content
		}
		if m < 0 {
			err := pbErrorf(dedupe.ErrMalformedPayload, "value at byte %d does not decode: %v", p, protowire.ParseError(m))
			if entry {
				return err
			}
			return pbAt(err, string(fd.Name()))
		}
		p += m
		d.occ = append(d.occ, o)
	}
	return nil
}

// pbGroupLen measures the group of field num that b starts with, just after
// its start tag: the length of its content and of content and end tag.
func pbGroupLen(num protowire.Number, b []byte) (content, total int) {
	for p := 0; ; {
		n2, wt, n := protowire.ConsumeTag(b[p:])
		if n < 0 {
			return 0, n
		}
		if wt == protowire.EndGroupType {
			if n2 != num { // let protowire name the error
				return 0, protowire.ConsumeFieldValue(num, protowire.StartGroupType, b)
			}
			return p, p + n
		}
		m := protowire.ConsumeFieldValue(n2, wt, b[p+n:])
		if m < 0 {
			return 0, m
		}
		p += n + m
	}
}

func pbWireName(t protowire.Type) string {
	switch t {
	case protowire.VarintType:
		return "varint"
	case protowire.Fixed32Type:
		return "fixed32"
	case protowire.Fixed64Type:
		return "fixed64"
	case protowire.BytesType:
		return "length-delimited"
	case protowire.StartGroupType:
		return "start group"
	case protowire.EndGroupType:
		return "end group"
	}
	return strconv.Itoa(int(t))
}

func pbWireType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.BoolKind, protoreflect.EnumKind, protoreflect.Int32Kind, protoreflect.Sint32Kind,
		protoreflect.Uint32Kind, protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Uint64Kind:
		return protowire.VarintType
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	case protoreflect.GroupKind:
		return protowire.StartGroupType
	}
	return protowire.BytesType // strings, bytes, messages
}

func pbPackable(k protoreflect.Kind) bool {
	return pbWireType(k) != protowire.BytesType && k != protoreflect.GroupKind
}

// singular writes a non-repeated field from its occurrences idx[lo:hi]
// (at least one): a message merges them all, a scalar is the last one.
func (d *protoDecoder) singular(dst []byte, fd protoreflect.FieldDescriptor, lo, hi, depth int) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return d.message(dst, fd.Message(), lo, hi, depth)
	}
	for p := lo; p < hi-1; p++ {
		if err := d.checkDiscarded(fd, p, depth); err != nil {
			return dst, err
		}
	}
	return d.scalar(dst, fd, &d.occ[d.idx[hi-1]])
}

// checkDiscarded checks an occurrence that a later one replaces: it must
// still be well-formed, as the Protobuf runtime would have decoded it.
func (d *protoDecoder) checkDiscarded(fd protoreflect.FieldDescriptor, p, depth int) error {
	o := &d.occ[d.idx[p]]
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !utf8.Valid(d.bytes(o)) {
			return pbErrorf(dedupe.ErrMalformedPayload, "string is not valid UTF-8")
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		d.validating++
		out, err := d.message(d.junk[:0], fd.Message(), p, p+1, depth)
		d.validating--
		d.junk, d.spent = out[:0], d.spent+len(out)
		return err
	}
	return nil
}

// oneof writes the set member of od, if any: the member that occurs last,
// from its occurrences after the last one of another member (setting
// another member cleared it). n is the count of members written so far.
func (d *protoDecoder) oneof(dst []byte, od protoreflect.OneofDescriptor, f protoFrame, n, depth int) ([]byte, int, error) {
	members := od.Fields()
	var win protoreflect.FieldDescriptor
	last, cut := -1, -1 // the winner's last occurrence, and the others'
	for j := range members.Len() {
		fd := members.Get(j)
		if lo, hi := d.fieldRange(f, fd.Index()); lo < hi {
			switch o := d.idx[hi-1]; {
			case o > last:
				win, last, cut = fd, o, last
			case o > cut:
				cut = o
			}
		}
	}
	if win == nil {
		return dst, n, nil
	}
	for j := range members.Len() {
		fd := members.Get(j)
		lo, hi := d.fieldRange(f, fd.Index())
		for p := lo; p < hi && (fd != win || d.idx[p] < cut); p++ {
			if err := d.checkDiscarded(fd, p, depth+1); err != nil {
				return dst, n, pbAt(err, string(fd.Name()))
			}
		}
	}
	lo, hi := d.fieldRange(f, win.Index())
	for d.idx[lo] < cut { // the winner's last occurrence is after cut
		lo++
	}
	dst = pbMember(dst, n, win)
	dst, err := d.singular(dst, win, lo, hi, depth+1)
	if err != nil {
		return dst, n, pbAt(err, string(win.Name()))
	}
	return dst, n + 1, nil
}

// list writes a repeated field from its occurrences idx[lo:hi]: each one
// an element, or for a packed occurrence, each value in it.
func (d *protoDecoder) list(dst []byte, fd protoreflect.FieldDescriptor, lo, hi, depth int) ([]byte, error) {
	if depth > dedupe.MaxNestingDepth {
		return dst, pbErrorf(dedupe.ErrMalformedPayload, "nesting deeper than %d levels", dedupe.MaxNestingDepth)
	}
	dst = append(dst, '[')
	n := 0
	var err error
	for p := lo; p < hi; p++ {
		o := &d.occ[d.idx[p]]
		switch {
		case fd.Message() != nil:
			dst = pbComma(dst, n)
			dst, err = d.message(dst, fd.Message(), p, p+1, depth+1)
			n++
		case o.wt == protowire.BytesType && pbPackable(fd.Kind()):
			dst, n, err = d.packed(dst, fd, o, n)
		default:
			dst = pbComma(dst, n)
			dst, err = d.scalar(dst, fd, o)
			n++
		}
		if err == nil {
			err = d.bounded(dst)
		}
		if err != nil {
			return dst, pbAt(err, strconv.Itoa(n-1))
		}
	}
	return append(dst, ']'), nil
}

func pbComma(dst []byte, n int) []byte {
	if n > 0 {
		return append(dst, ',')
	}
	return dst
}

// packed writes the values of a packed occurrence as elements n, n+1, ...
func (d *protoDecoder) packed(dst []byte, fd protoreflect.FieldDescriptor, o *protoOcc, n int) ([]byte, int, error) {
	b := d.bytes(o)
	v := protoOcc{wt: pbWireType(fd.Kind())}
	for len(b) > 0 {
		var m int
		switch v.wt {
		case protowire.VarintType:
			v.val, m = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x uint32
			x, m = protowire.ConsumeFixed32(b)
			v.val = uint64(x)
		default:
			v.val, m = protowire.ConsumeFixed64(b)
		}
		if m < 0 {
			return dst, n + 1, pbErrorf(dedupe.ErrMalformedPayload, "packed value does not decode: %v", protowire.ParseError(m))
		}
		b = b[m:]
		dst = pbComma(dst, n)
		var err error
		if dst, err = d.scalar(dst, fd, &v); err == nil {
			err = d.bounded(dst)
		}
		if err != nil {
			return dst, n + 1, err
		}
		n++
	}
	return dst, n, nil
}

// mapField writes a map from its entries idx[lo:hi]. Of entries with one
// key the last wins; the others must still decode. Members are written in
// the byte order of their keys, which is as good as any: the canonicalizer
// sorts them.
func (d *protoDecoder) mapField(dst []byte, fd protoreflect.FieldDescriptor, lo, hi, depth int) ([]byte, error) {
	if depth > dedupe.MaxNestingDepth {
		return dst, pbErrorf(dedupe.ErrMalformedPayload, "nesting deeper than %d levels", dedupe.MaxNestingDepth)
	}
	e0, k0 := len(d.ents), len(d.keys)
	defer func() { d.ents, d.keys = d.ents[:e0], d.keys[:k0] }()
	for p := lo; p < hi; p++ {
		ks := len(d.keys)
		if err := d.mapKey(fd, p); err != nil {
			return dst, err
		}
		d.ents = append(d.ents, protoEntry{ks: ks, ke: len(d.keys), pos: p})
	}
	ents := d.ents[e0:]
	if len(ents) > 1 {
		slices.SortStableFunc(ents, func(a, b protoEntry) int {
			return bytes.Compare(d.keys[a.ks:a.ke], d.keys[b.ks:b.ke])
		})
	}
	dst = append(dst, '{')
	n := 0
	for i := range len(ents) {
		e := d.ents[e0+i]
		key := d.keys[e.ks:e.ke]
		last := i == len(ents)-1 || string(key) != string(d.keys[d.ents[e0+i+1].ks:d.ents[e0+i+1].ke])
		var err error
		if !last {
			d.validating++
			d.junk, err = d.mapValue(d.junk[:0], fd, e.pos, depth+1)
			d.validating--
			d.spent += len(d.junk)
			if err == nil {
				err = d.bounded(dst)
			}
		} else {
			dst = pbComma(dst, n)
			n++
			dst, _ = appendJSONString(dst, key) // checked valid when read
			dst = append(dst, ':')
			dst, err = d.mapValue(dst, fd, e.pos, depth+1)
		}
		if err != nil {
			return dst, pbAt(err, string(d.keys[e.ks:e.ke]))
		}
	}
	return append(dst, '}'), nil
}

// mapKey appends to keys the text of the key of the entry at idx[p].
func (d *protoDecoder) mapKey(fd protoreflect.FieldDescriptor, p int) error {
	f, err := d.scan(fd.Message(), p, p+1)
	if err != nil {
		return err
	}
	defer d.pop(f)
	kfd := fd.MapKey()
	lo, hi := d.fieldRange(f, kfd.Index())
	if lo == hi {
		switch kfd.Kind() {
		case protoreflect.StringKind:
		case protoreflect.BoolKind:
			d.keys = append(d.keys, "false"...)
		default:
			d.keys = append(d.keys, '0')
		}
		return nil
	}
	for q := lo; q < hi-1; q++ {
		if err := d.checkDiscarded(kfd, q, 0); err != nil {
			return err
		}
	}
	o := &d.occ[d.idx[hi-1]]
	if kfd.Kind() == protoreflect.StringKind {
		if !utf8.Valid(d.bytes(o)) {
			return pbErrorf(dedupe.ErrMalformedPayload, "map key is not valid UTF-8")
		}
		d.keys = append(d.keys, d.bytes(o)...)
		return nil
	}
	// Integer and bool keys: their JSON text is their member name.
	d.keys, err = d.scalar(d.keys, kfd, o)
	return err
}

// mapValue writes the value of the entry at idx[p]; a missing value is the
// default, an empty message for a message value.
func (d *protoDecoder) mapValue(dst []byte, fd protoreflect.FieldDescriptor, p, depth int) ([]byte, error) {
	f, err := d.scan(fd.Message(), p, p+1)
	if err != nil {
		return dst, err
	}
	vfd := fd.MapValue()
	lo, hi := d.fieldRange(f, vfd.Index())
	switch {
	case vfd.Message() != nil:
		dst, err = d.message(dst, vfd.Message(), lo, hi, depth)
	case lo == hi:
		dst = pbDefault(dst, vfd)
	default:
		dst, err = d.singular(dst, vfd, lo, hi, depth)
	}
	d.pop(f)
	return dst, err
}

// pbDefault writes the default of an absent scalar field.
func pbDefault(dst []byte, fd protoreflect.FieldDescriptor) []byte {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return append(dst, "false"...)
	case protoreflect.StringKind, protoreflect.BytesKind:
		return append(dst, `""`...)
	case protoreflect.EnumKind:
		return pbEnum(dst, fd.Enum(), fd.Default().Enum())
	}
	return append(dst, '0')
}

func pbEnum(dst []byte, ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) []byte {
	if v := ed.Values().ByNumber(n); v != nil {
		dst = append(dst, '"')
		dst = append(dst, v.Name()...)
		return append(dst, '"')
	}
	return strconv.AppendInt(dst, int64(n), 10)
}

// scalar writes the value of one occurrence of a scalar field, converted as
// the Protobuf runtime converts it (a 64-bit varint read as int32 keeps its
// low 32 bits).
func (d *protoDecoder) scalar(dst []byte, fd protoreflect.FieldDescriptor, o *protoOcc) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		if o.val != 0 {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case protoreflect.EnumKind:
		return pbEnum(dst, fd.Enum(), protoreflect.EnumNumber(int32(o.val))), nil
	case protoreflect.Int32Kind, protoreflect.Sfixed32Kind:
		return strconv.AppendInt(dst, int64(int32(o.val)), 10), nil
	case protoreflect.Sint32Kind:
		return strconv.AppendInt(dst, int64(int32(protowire.DecodeZigZag(o.val&math.MaxUint32))), 10), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return strconv.AppendUint(dst, uint64(uint32(o.val)), 10), nil
	case protoreflect.Int64Kind, protoreflect.Sfixed64Kind:
		return strconv.AppendInt(dst, int64(o.val), 10), nil
	case protoreflect.Sint64Kind:
		return strconv.AppendInt(dst, protowire.DecodeZigZag(o.val), 10), nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.AppendUint(dst, o.val, 10), nil
	case protoreflect.FloatKind:
		return d.float(dst, float64(math.Float32frombits(uint32(o.val))), 32)
	case protoreflect.DoubleKind:
		return d.float(dst, math.Float64frombits(o.val), 64)
	case protoreflect.StringKind:
		out, err := appendJSONString(dst, d.bytes(o))
		if err != nil {
			return dst, pbErrorf(dedupe.ErrMalformedPayload, "string is not valid UTF-8")
		}
		return out, nil
	}
	dst = base64.StdEncoding.AppendEncode(append(dst, '"'), d.bytes(o))
	return append(dst, '"'), nil
}

// float writes f in the shortest form that reads back as the same float of
// that many bits. 'g' may use an exponent ("1e+06"), which JSON allows.
func (d *protoDecoder) float(dst []byte, f float64, bits int) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		if d.validating > 0 {
			return append(dst, '0'), nil
		}
		return dst, pbErrorf(dedupe.ErrNonFiniteNumber, "%s has no JSON form", strconv.FormatFloat(f, 'g', -1, bits))
	}
	return strconv.AppendFloat(dst, f, 'g', -1, bits), nil
}

// protoError is a decoding error on its way out of the walk, collecting
// the JSON Pointer of where it happened.
type protoError struct {
	sentinel error
	msg      string
	rev      []string // reference tokens, innermost first
}

func (e *protoError) Error() string { return e.wrap().Error() }

func (e *protoError) wrap() error {
	if len(e.rev) == 0 {
		return fmt.Errorf("%w: %s in the top-level message", e.sentinel, e.msg)
	}
	var b strings.Builder
	for i := len(e.rev) - 1; i >= 0; i-- {
		b.WriteByte('/')
		b.WriteString(pbPointerToken(e.rev[i]))
	}
	return fmt.Errorf("%w: %s at %s", e.sentinel, e.msg, b.String())
}

func pbErrorf(sentinel error, format string, args ...any) error {
	return &protoError{sentinel: sentinel, msg: fmt.Sprintf(format, args...)}
}

// pbAt adds the reference token of the field, element or map key the error
// happened in.
func pbAt(err error, token string) error {
	if e, ok := err.(*protoError); ok {
		e.rev = append(e.rev, token)
	}
	return err
}
