package decode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/idemstream/idemstream/dedupe"
)

// avroOp is what one step of a program reads from the writer's bytes and
// writes as JSON. A program is compiled once per writer schema (Avro's
// schema resolution happens then), so decoding a record is one walk over
// its bytes with no lookups by name.
type avroOp uint8

const (
	opNull avroOp = iota
	opBoolean
	opInt       // an int or long read, an integer written
	opIntFloat  // an int or long read, written as the reader's float
	opIntDouble // an int or long read, written as the reader's double
	opFloat
	opFloatDouble
	opDouble
	opBytes        // base64
	opString       // a JSON string
	opStringBytes  // a string read, written as the reader's bytes
	opBytesString  // bytes read, written as the reader's string
	opDecimalBytes // a two's complement big-endian unscaled value, written as a number
	opDecimalFixed //  the same in a fixed of size n
	opFixed        // base64
	opRecord       //
	opEnum         //
	opArray        //
	opMap          //
	opWriterUnion  // the writer's branch index chooses a program
	opReaderUnion  // a value written inside the reader union's tag
	opFail         // a writer union branch the reader cannot read
)

type avroProg struct {
	op    avroOp
	int32 bool // the writer's int (not long) read by opInt, opIntFloat or opIntDouble
	size  int  // fixed size
	scale int  // decimal scale
	// record: the writer's fields in order; defaults of the reader's
	// fields the writer lacks, each as `"name":value`, and the deepest
	// nesting of those values.
	fields   []progField
	defaults [][]byte
	defDepth int
	// enum: the writer's symbol index to the quoted reader symbol.
	symbols [][]byte
	elem    *avroProg   // array items, map values, the value inside a tag
	cases   []*avroProg // writer union branches
	open    []byte      // opReaderUnion: `{"tag":` (nil for a bare value)
	err     string      // opFail: why
	// For writing the canonical form directly (avro_canonical.go): a
	// record's members in canonical order, its defaults canonical; a
	// tagged branch's tag and opening in canonical form.
	canon     []canonEntry
	canonDefs []canonDefault
	noCanon   bool // the record names a member twice: only AppendJSON's text says how that fails
	tag       []byte
	canonOpen []byte
}

// progField is a writer field: read and written under name (`"name":`), or
// skipped when the reader has no such field.
type progField struct {
	name []byte
	raw  []byte // the name alone, for the path rules
	prog *avroProg
	skip *avroSchema
}

// resolver compiles a pair of schemas. A record, array or map enters memo
// before its parts are resolved, so that a recursive type resolves to a
// cycle; its parts assume it resolves. When it does not, everything
// resolved under that assumption leaves memo with it (a writer union
// keeps going past a branch that fails, and a later reference to the
// same pair must not find the half-built program). The failure stays in
// failed: it happened under the most favourable assumption.
type resolver struct {
	memo   map[[2]*avroSchema]*avroProg
	order  [][2]*avroSchema // memo's keys, oldest first
	failed map[[2]*avroSchema]error
}

// compileAvro resolves the writer schema against the reader schema.
func compileAvro(w, r *avroSchema) (*avroProg, error) {
	rs := &resolver{memo: map[[2]*avroSchema]*avroProg{}, failed: map[[2]*avroSchema]error{}}
	p, err := rs.resolve(w, r, "")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", dedupe.ErrIncompatibleSchema, err)
	}
	return p, nil
}

func (rs *resolver) resolve(w, r *avroSchema, path string) (*avroProg, error) {
	if w.kind == avroUnion {
		p := &avroProg{op: opWriterUnion}
		ok := false
		for _, b := range w.branches {
			bp, err := rs.resolve(b, r, path)
			if err != nil {
				bp = &avroProg{op: opFail, err: err.Error()}
			} else {
				ok = true
			}
			p.cases = append(p.cases, bp)
		}
		if !ok {
			return nil, fmt.Errorf("%s: no branch of the writer's union can be read as %s", at(path), describeKind(r))
		}
		return p, nil
	}
	if r.kind == avroUnion {
		i := pickBranch(w, r)
		if i < 0 {
			return nil, fmt.Errorf("%s: the writer's %s matches no branch of the reader's union", at(path), describeKind(w))
		}
		inner, err := rs.resolve(w, r.branches[i], path)
		if err != nil {
			return nil, err
		}
		p := &avroProg{op: opReaderUnion, elem: inner, open: unionOpen(r, i)}
		if p.open != nil {
			p.tag = []byte(r.branches[i].tag())
			p.canonOpen, _, _ = appendCanonicalString([]byte{'{'}, p.tag)
			p.canonOpen = append(p.canonOpen, ':')
		}
		return p, nil
	}
	return rs.resolveSame(w, r, path)
}

// unionOpen is what precedes a value of branch i of union u: nothing for
// null and for the value of an optional (a union of null and one type),
// else `{"<tag>":`, closed by `}`.
func unionOpen(u *avroSchema, i int) []byte {
	b := u.branches[i]
	if b.kind == avroNull || (len(u.branches) == 2 && (u.branches[0].kind == avroNull || u.branches[1].kind == avroNull)) {
		return nil
	}
	q, _ := json.Marshal(b.tag())
	return append(append([]byte{'{'}, q...), ':')
}

// pickBranch is the first reader branch that matches w exactly, else the
// first it can be promoted to, as Avro's resolution rules say.
func pickBranch(w *avroSchema, u *avroSchema) int {
	for i, b := range u.branches {
		if b.kind == w.kind && (b.name == "" || namesMatch(w, b)) {
			return i
		}
	}
	for i, b := range u.branches {
		if promotable(w.kind, b.kind) {
			return i
		}
	}
	return -1
}

func promotable(w, r avroKind) bool {
	switch w {
	case avroInt:
		return r == avroLong || r == avroFloat || r == avroDouble
	case avroLong:
		return r == avroFloat || r == avroDouble
	case avroFloat:
		return r == avroDouble
	case avroString:
		return r == avroBytes
	case avroBytes:
		return r == avroString
	}
	return false
}

// namesMatch compares named types by unqualified name, or by one of the
// reader's aliases.
func namesMatch(w, r *avroSchema) bool {
	if shortName(w.name) == shortName(r.name) {
		return true
	}
	return slices.Contains(r.aliases, w.name) || slices.ContainsFunc(r.aliases, func(a string) bool { return shortName(a) == shortName(w.name) })
}

func (rs *resolver) resolveSame(w, r *avroSchema, path string) (*avroProg, error) {
	if op, ok := primitiveOp(w, r); ok {
		return &avroProg{op: op, scale: r.scale, int32: w.kind == avroInt}, nil
	}
	if w.kind != r.kind {
		return nil, fmt.Errorf("%s: the writer's %s cannot be read as %s", at(path), describeKind(w), describeKind(r))
	}
	key := [2]*avroSchema{w, r}
	if p, ok := rs.memo[key]; ok {
		return p, nil
	}
	if err, ok := rs.failed[key]; ok {
		return nil, fmt.Errorf("%s: %w", at(path), err)
	}
	switch w.kind {
	case avroRecord:
		if !namesMatch(w, r) {
			return nil, fmt.Errorf("%s: record %s cannot be read as record %s", at(path), w.name, r.name)
		}
		p := &avroProg{op: opRecord}
		mark := rs.remember(key, p)
		if err := rs.record(p, w, r, path); err != nil {
			return nil, rs.forget(key, mark, err)
		}
		return p, nil
	case avroEnum:
		return enumProg(w, r, path)
	case avroFixed:
		if !namesMatch(w, r) || w.size != r.size {
			return nil, fmt.Errorf("%s: fixed %s (%d bytes) cannot be read as fixed %s (%d bytes)", at(path), w.name, w.size, r.name, r.size)
		}
		if r.decimal {
			if w.decimal && w.scale != r.scale {
				return nil, fmt.Errorf("%s: decimal of scale %d cannot be read as scale %d", at(path), w.scale, r.scale)
			}
			return &avroProg{op: opDecimalFixed, size: r.size, scale: r.scale}, nil
		}
		return &avroProg{op: opFixed, size: r.size}, nil
	case avroArray, avroMap:
		p := &avroProg{op: opArray}
		wi, ri := w.items, r.items
		if w.kind == avroMap {
			p.op, wi, ri = opMap, w.values, r.values
		}
		mark := rs.remember(key, p)
		elem, err := rs.resolve(wi, ri, path+"/*")
		if err != nil {
			return nil, rs.forget(key, mark, err)
		}
		p.elem = elem
		return p, nil
	}
	return nil, fmt.Errorf("%s: the writer's %s cannot be read as %s", at(path), describeKind(w), describeKind(r))
}

func (rs *resolver) remember(key [2]*avroSchema, p *avroProg) int {
	rs.memo[key] = p
	rs.order = append(rs.order, key)
	return len(rs.order) - 1
}

func (rs *resolver) forget(key [2]*avroSchema, mark int, err error) error {
	for _, k := range rs.order[mark:] {
		delete(rs.memo, k)
	}
	rs.order = rs.order[:mark]
	rs.failed[key] = err
	return err
}

func primitiveOp(w, r *avroSchema) (avroOp, bool) {
	if r.decimal && r.kind == avroBytes && w.kind == avroBytes {
		if w.decimal && w.scale != r.scale {
			return 0, false
		}
		return opDecimalBytes, true
	}
	type pair struct{ w, r avroKind }
	op, ok := map[pair]avroOp{
		{avroNull, avroNull}: opNull, {avroBoolean, avroBoolean}: opBoolean,
		{avroInt, avroInt}: opInt, {avroInt, avroLong}: opInt, {avroLong, avroLong}: opInt,
		{avroInt, avroFloat}: opIntFloat, {avroLong, avroFloat}: opIntFloat,
		{avroInt, avroDouble}: opIntDouble, {avroLong, avroDouble}: opIntDouble,
		{avroFloat, avroFloat}: opFloat, {avroFloat, avroDouble}: opFloatDouble, {avroDouble, avroDouble}: opDouble,
		{avroBytes, avroBytes}: opBytes, {avroString, avroString}: opString,
		{avroString, avroBytes}: opStringBytes, {avroBytes, avroString}: opBytesString,
	}[pair{w.kind, r.kind}]
	return op, ok
}

func (rs *resolver) record(p *avroProg, w, r *avroSchema, path string) error {
	used := make([]bool, len(r.fields))
	for _, wf := range w.fields {
		i := slices.IndexFunc(r.fields, func(rf *avroField) bool {
			return rf.name == wf.name || slices.Contains(rf.aliases, wf.name)
		})
		if i < 0 {
			p.fields = append(p.fields, progField{skip: wf.typ})
			continue
		}
		// Two writer fields read as one reader field (one by its name,
		// the other by an alias) would write that member twice: the
		// schemas do not resolve, for every record alike.
		if used[i] {
			return fmt.Errorf("%s: the writer's field %s and another before it are both the reader's field %s", at(path), wf.name, r.fields[i].name)
		}
		used[i] = true
		rf := r.fields[i]
		fp, err := rs.resolve(wf.typ, rf.typ, path+"/"+rf.name)
		if err != nil {
			return err
		}
		p.fields = append(p.fields, progField{name: memberName(rf.name), prog: fp})
	}
	for i, rf := range r.fields {
		if used[i] {
			continue
		}
		if rf.def == nil {
			return fmt.Errorf("%s: the reader's field %s has no default and the writer has no such field", at(path), rf.name)
		}
		v, err := defaultJSON(nil, rf.typ, rf.def, 0)
		if err != nil {
			return fmt.Errorf("%s: default of %s: %w", at(path), rf.name, err)
		}
		p.defaults = append(p.defaults, append(memberName(rf.name), v...))
		p.defDepth = max(p.defDepth, jsonDepth(v))
	}
	return p.planCanonical()
}

// jsonDepth is the deepest nesting of objects and arrays in the JSON text
// v: a default's, which the decoder adds to the depth it is written at.
func jsonDepth(v []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

// memberName is `"n":`, with room for appendShort to copy it as words.
func memberName(n string) []byte {
	b := append(make([]byte, 0, len(n)+3+16), '"')
	return append(append(b, n...), '"', ':')
}

func enumProg(w, r *avroSchema, path string) (*avroProg, error) {
	if !namesMatch(w, r) {
		return nil, fmt.Errorf("%s: enum %s cannot be read as enum %s", at(path), w.name, r.name)
	}
	p := &avroProg{op: opEnum}
	for _, s := range w.symbols {
		// Avro reads a symbol the reader lacks as the reader's default;
		// that would make two requests one, so decoding it fails instead.
		if !slices.Contains(r.symbols, s) {
			s = ""
		}
		if s == "" {
			p.symbols = append(p.symbols, nil)
			continue
		}
		q, _ := json.Marshal(s)
		p.symbols = append(p.symbols, q)
	}
	return p, nil
}

func at(path string) string {
	if path == "" {
		return "at the root"
	}
	return "at " + path
}

func describeKind(s *avroSchema) string {
	if s.name != "" {
		return s.kind.String() + " " + s.name
	}
	if s.kind == avroUnion {
		var names []string
		for _, b := range s.branches {
			names = append(names, b.tag())
		}
		return "union [" + strings.Join(names, ", ") + "]"
	}
	return s.kind.String()
}

// defaultJSON writes a field's default, given as JSON in the schema, as
// the mapping writes a value of that type, so that a record without the
// field and one that carries the default are the same request.
func defaultJSON(dst []byte, s *avroSchema, def json.RawMessage, depth int) ([]byte, error) {
	if depth > dedupe.MaxNestingDepth {
		return nil, fmt.Errorf("default nested too deeply")
	}
	dec := json.NewDecoder(bytes.NewReader(def))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return defaultValue(dst, s, v, depth)
}

// maxDefaultJSON bounds a default's JSON: a record's default fills the
// fields it leaves out from their own defaults, and a few record types,
// each with two fields of the next, would otherwise double it at every
// level.
const maxDefaultJSON = 1 << 20

func defaultValue(dst []byte, s *avroSchema, v any, depth int) ([]byte, error) {
	bad := func() ([]byte, error) { return nil, fmt.Errorf("%v is not a %s", v, describeKind(s)) }
	if len(dst) > maxDefaultJSON {
		return nil, fmt.Errorf("default is more than %d bytes of JSON", maxDefaultJSON)
	}
	switch s.kind {
	case avroNull:
		if v != nil {
			return bad()
		}
		return append(dst, "null"...), nil
	case avroBoolean:
		b, ok := v.(bool)
		if !ok {
			return bad()
		}
		return appendBool(dst, b), nil
	case avroInt, avroLong, avroFloat, avroDouble:
		return defaultNumber(dst, s, v)
	case avroBytes, avroFixed:
		str, ok := v.(string)
		if !ok {
			return bad()
		}
		raw, ok := latin1Bytes(str)
		if !ok || (s.kind == avroFixed && len(raw) != s.size) || (s.decimal && s.scale > maxDefaultJSON) {
			return bad()
		}
		if s.decimal {
			return appendDecimal(dst, raw, s.scale), nil
		}
		return appendBase64(dst, raw), nil
	case avroString:
		str, ok := v.(string)
		if !ok {
			return bad()
		}
		return appendJSONString(dst, []byte(str))
	case avroEnum:
		str, ok := v.(string)
		if !ok || !slices.Contains(s.symbols, str) {
			return bad()
		}
		return appendJSONString(dst, []byte(str))
	case avroUnion:
		// A union's default is a value of its first branch.
		dst = append(dst, unionOpen(s, 0)...)
		out, err := defaultValue(dst, s.branches[0], v, depth+1)
		if err == nil && unionOpen(s, 0) != nil {
			out = append(out, '}')
		}
		return out, err
	}
	return defaultContainer(dst, s, v, depth)
}

func defaultNumber(dst []byte, s *avroSchema, v any) ([]byte, error) {
	n, ok := v.(json.Number)
	if !ok {
		return nil, fmt.Errorf("%v is not a %s", v, s.kind)
	}
	switch s.kind {
	case avroInt, avroLong:
		i, err := n.Int64()
		if err != nil || (s.kind == avroInt && int64(int32(i)) != i) {
			return nil, fmt.Errorf("%v is not a %s", v, s.kind)
		}
		return appendInt(dst, i), nil
	case avroFloat:
		f, err := n.Float64()
		if err != nil {
			return nil, err
		}
		return appendFloat(dst, float64(float32(f)), 32)
	default:
		f, err := n.Float64()
		if err != nil {
			return nil, err
		}
		return appendFloat(dst, f, 64)
	}
}

func defaultContainer(dst []byte, s *avroSchema, v any, depth int) ([]byte, error) {
	switch s.kind {
	case avroArray:
		items, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("default is not an array")
		}
		dst = append(dst, '[')
		for i, it := range items {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = defaultValue(dst, s.items, it, depth+1); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case avroMap, avroRecord:
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("default is not an object")
		}
		dst = append(dst, '{')
		first := true
		add := func(name string, t *avroSchema, val any) error {
			if !first {
				dst = append(dst, ',')
			}
			first = false
			var err error
			if dst, err = appendJSONString(dst, []byte(name)); err != nil {
				return err
			}
			dst, err = defaultValue(append(dst, ':'), t, val, depth+1)
			return err
		}
		if s.kind == avroMap {
			for _, k := range slices.Sorted(maps.Keys(obj)) {
				if err := add(k, s.values, obj[k]); err != nil {
					return nil, err
				}
			}
			return append(dst, '}'), nil
		}
		for _, f := range s.fields {
			val, ok := obj[f.name]
			if !ok {
				if f.def == nil {
					return nil, fmt.Errorf("default of record %s lacks field %s", s.name, f.name)
				}
				d := json.NewDecoder(bytes.NewReader(f.def))
				d.UseNumber()
				_ = d.Decode(&val)
			}
			if err := add(f.name, f.typ, val); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	}
	return nil, fmt.Errorf("no default for %s", describeKind(s))
}

// latin1Bytes reads a bytes default: Avro spells each byte as the code
// point of the same value.
func latin1Bytes(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			return nil, false
		}
		out = append(out, byte(r))
	}
	return out, true
}
