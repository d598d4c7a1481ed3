package decode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// avroKind is one of Avro's primitive or complex types.
type avroKind uint8

const (
	avroNull avroKind = iota
	avroBoolean
	avroInt
	avroLong
	avroFloat
	avroDouble
	avroBytes
	avroString
	avroRecord
	avroEnum
	avroArray
	avroMap
	avroUnion
	avroFixed
)

var avroPrimitives = map[string]avroKind{
	"null": avroNull, "boolean": avroBoolean, "int": avroInt, "long": avroLong,
	"float": avroFloat, "double": avroDouble, "bytes": avroBytes, "string": avroString,
}

var avroKindNames = [...]string{"null", "boolean", "int", "long", "float", "double", "bytes", "string",
	"record", "enum", "array", "map", "union", "fixed"}

func (k avroKind) String() string { return avroKindNames[k] }

// avroSchema is a parsed Avro schema. Named types are shared: a reference
// by name points at the one definition, so recursive records are cycles.
type avroSchema struct {
	kind     avroKind
	name     string   // full name of a record, enum or fixed
	aliases  []string // full names
	fields   []*avroField
	symbols  []string
	enumDef  string // the enum's default symbol ("" when none)
	items    *avroSchema
	values   *avroSchema
	branches []*avroSchema
	size     int
	// decimal is set for the decimal logical type on bytes or fixed; any
	// other logical type is read as its underlying type.
	decimal   bool
	precision int
	scale     int
}

type avroField struct {
	name    string
	aliases []string
	typ     *avroSchema
	def     json.RawMessage // nil when the field has no default
}

// tag is the name a branch of a tagged union is written under: a named
// type's full name, else the type's name, as Avro's JSON encoding does.
func (s *avroSchema) tag() string {
	if s.name != "" {
		return s.name
	}
	return s.kind.String()
}

// avroParser parses schema text into avroSchemas, resolving names against
// the types it has defined so far (those of referenced schemas first).
type avroParser struct {
	named map[string]*avroSchema
}

func newAvroParser() *avroParser { return &avroParser{named: map[string]*avroSchema{}} }

// parse reads one schema document.
func (p *avroParser) parse(text string) (*avroSchema, error) {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("avro schema is not JSON: %w", err)
	}
	return p.schema(v, "")
}

func (p *avroParser) schema(v any, ns string) (*avroSchema, error) {
	switch t := v.(type) {
	case string:
		if k, ok := avroPrimitives[t]; ok {
			return &avroSchema{kind: k}, nil
		}
		if s, ok := p.named[fullName(t, ns)]; ok {
			return s, nil
		}
		if s, ok := p.named[t]; ok {
			return s, nil
		}
		return nil, fmt.Errorf("avro schema names unknown type %q", t)
	case []any:
		u := &avroSchema{kind: avroUnion}
		if len(t) == 0 {
			return nil, fmt.Errorf("avro union without a branch")
		}
		for _, b := range t {
			s, err := p.schema(b, ns)
			if err != nil {
				return nil, err
			}
			if s.kind == avroUnion {
				return nil, fmt.Errorf("avro union directly inside a union")
			}
			// A branch is told by its tag: a record named "map" beside a
			// map would give two values one canonical form (Avro's JSON
			// encoding cannot tell them apart either).
			for _, o := range u.branches {
				if o.tag() == s.tag() {
					return nil, fmt.Errorf("avro union has two branches named %q", s.tag())
				}
			}
			u.branches = append(u.branches, s)
		}
		return u, nil
	case map[string]any:
		return p.complex(t, ns)
	}
	return nil, fmt.Errorf("avro schema has a %T where a type belongs", v)
}

func (p *avroParser) complex(m map[string]any, ns string) (*avroSchema, error) {
	typ, _ := m["type"].(string)
	switch typ {
	case "record", "error":
		return p.record(m, ns)
	case "enum":
		return p.enum(m, ns)
	case "fixed":
		s, err := p.define(m, ns, avroFixed)
		if err != nil {
			return nil, err
		}
		n, ok := intAttr(m, "size")
		if !ok || n < 0 {
			return nil, fmt.Errorf("avro fixed %s has no valid size", s.name)
		}
		s.size = n
		return s, p.logical(m, s)
	case "array":
		items, err := p.schema(m["items"], ns)
		if err != nil {
			return nil, err
		}
		return &avroSchema{kind: avroArray, items: items}, nil
	case "map":
		values, err := p.schema(m["values"], ns)
		if err != nil {
			return nil, err
		}
		return &avroSchema{kind: avroMap, values: values}, nil
	}
	if inner, ok := m["type"]; ok {
		// {"type": "long", "logicalType": ...} or {"type": {...}}.
		s, err := p.schema(inner, ns)
		if err != nil {
			return nil, err
		}
		if s.kind == avroBytes && m["logicalType"] == "decimal" {
			c := *s
			return &c, p.logical(m, &c)
		}
		return s, nil
	}
	return nil, fmt.Errorf("avro schema object without a type")
}

// logical applies the decimal logical type. Avro says an invalid logical
// type is ignored and the underlying type used.
func (p *avroParser) logical(m map[string]any, s *avroSchema) error {
	if m["logicalType"] != "decimal" {
		return nil
	}
	prec, ok := intAttr(m, "precision")
	scale, _ := intAttr(m, "scale")
	if !ok || prec <= 0 || scale < 0 || scale > prec {
		return nil
	}
	s.decimal, s.precision, s.scale = true, prec, scale
	return nil
}

func (p *avroParser) define(m map[string]any, ns string, k avroKind) (*avroSchema, error) {
	name, _ := m["name"].(string)
	if name == "" {
		return nil, fmt.Errorf("avro %s without a name", k)
	}
	if n, ok := m["namespace"].(string); ok && !strings.Contains(name, ".") {
		ns = n
	}
	s := &avroSchema{kind: k, name: fullName(name, ns)}
	if _, primitive := avroPrimitives[s.name]; primitive {
		// Avro: primitive type names may not be defined in any namespace.
		return nil, fmt.Errorf("avro %s named %q, a primitive type's name", k, s.name)
	}
	if _, dup := p.named[s.name]; dup {
		return nil, fmt.Errorf("avro type %s defined twice", s.name)
	}
	if as, ok := m["aliases"].([]any); ok {
		for _, a := range as {
			if a, ok := a.(string); ok {
				s.aliases = append(s.aliases, fullName(a, namespaceOf(s.name)))
			}
		}
	}
	p.named[s.name] = s
	return s, nil
}

func (p *avroParser) record(m map[string]any, ns string) (*avroSchema, error) {
	s, err := p.define(m, ns, avroRecord)
	if err != nil {
		return nil, err
	}
	fields, ok := m["fields"].([]any)
	if !ok {
		return nil, fmt.Errorf("avro record %s has no fields", s.name)
	}
	inner := namespaceOf(s.name)
	seen := map[string]bool{}
	for _, f := range fields {
		fm, ok := f.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("avro record %s has a field that is not an object", s.name)
		}
		name, _ := fm["name"].(string)
		if !validAvroName(name) || seen[name] {
			return nil, fmt.Errorf("avro record %s: field name %q is invalid or repeated", s.name, name)
		}
		seen[name] = true
		typ, err := p.schema(fm["type"], inner)
		if err != nil {
			return nil, fmt.Errorf("avro record %s field %s: %w", s.name, name, err)
		}
		fd := &avroField{name: name, typ: typ}
		if def, ok := fm["default"]; ok {
			if fd.def, err = json.Marshal(def); err != nil {
				return nil, err
			}
		}
		if as, ok := fm["aliases"].([]any); ok {
			for _, a := range as {
				if a, ok := a.(string); ok {
					fd.aliases = append(fd.aliases, a)
				}
			}
		}
		s.fields = append(s.fields, fd)
	}
	return s, nil
}

func (p *avroParser) enum(m map[string]any, ns string) (*avroSchema, error) {
	s, err := p.define(m, ns, avroEnum)
	if err != nil {
		return nil, err
	}
	syms, _ := m["symbols"].([]any)
	for _, y := range syms {
		y, ok := y.(string)
		if !ok || !validAvroName(y) || slices.Contains(s.symbols, y) {
			return nil, fmt.Errorf("avro enum %s: symbol %v is invalid or repeated", s.name, y)
		}
		s.symbols = append(s.symbols, y)
	}
	if len(s.symbols) == 0 {
		return nil, fmt.Errorf("avro enum %s has no symbols", s.name)
	}
	if d, ok := m["default"].(string); ok {
		if !slices.Contains(s.symbols, d) {
			return nil, fmt.Errorf("avro enum %s: default %q is not a symbol", s.name, d)
		}
		s.enumDef = d
	}
	return s, nil
}

func sortedJSON(names []string) []byte {
	b, _ := json.Marshal(slices.Sorted(slices.Values(names)))
	return b
}

func intAttr(m map[string]any, k string) (int, bool) {
	n, ok := m[k].(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	if err != nil || i > 1<<30 {
		return 0, false
	}
	return int(i), true
}

func fullName(name, ns string) string {
	if strings.Contains(name, ".") || ns == "" {
		return name
	}
	return ns + "." + name
}

func namespaceOf(full string) string {
	if i := strings.LastIndexByte(full, '.'); i >= 0 {
		return full[:i]
	}
	return ""
}

func shortName(full string) string { return full[strings.LastIndexByte(full, '.')+1:] }

func validAvroName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z')
		if !letter && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// describe writes a canonical description of s (every name, type, default
// and logical type that reading depends on), the input of the reader
// schema's digest: two texts of one schema that differ only in layout,
// docs or attribute order share it.
func (s *avroSchema) describe(b *bytes.Buffer, seen map[*avroSchema]bool) {
	if s.name != "" && seen[s] {
		b.WriteString(`"` + s.name + `"`)
		return
	}
	seen[s] = true
	switch s.kind {
	case avroRecord:
		fmt.Fprintf(b, `{"type":"record","name":%q,"aliases":%s,"fields":[`, s.name, sortedJSON(s.aliases))
		for i, f := range s.fields {
			if i > 0 {
				b.WriteByte(',')
			}
			// Aliases change which writer fields a reader field takes.
			fmt.Fprintf(b, `{"name":%q,"aliases":%s,"type":`, f.name, sortedJSON(f.aliases))
			f.typ.describe(b, seen)
			if f.def != nil {
				b.WriteString(`,"default":`)
				b.Write(f.def)
			}
			b.WriteByte('}')
		}
		b.WriteString("]}")
	case avroEnum:
		sy, _ := json.Marshal(s.symbols)
		fmt.Fprintf(b, `{"type":"enum","name":%q,"aliases":%s,"symbols":%s,"default":%q}`, s.name, sortedJSON(s.aliases), sy, s.enumDef)
	case avroFixed:
		fmt.Fprintf(b, `{"type":"fixed","name":%q,"aliases":%s,"size":%d,"decimal":[%t,%d,%d]}`, s.name, sortedJSON(s.aliases), s.size, s.decimal, s.precision, s.scale)
	case avroArray:
		b.WriteString(`{"type":"array","items":`)
		s.items.describe(b, seen)
		b.WriteByte('}')
	case avroMap:
		b.WriteString(`{"type":"map","values":`)
		s.values.describe(b, seen)
		b.WriteByte('}')
	case avroUnion:
		b.WriteByte('[')
		for i, br := range s.branches {
			if i > 0 {
				b.WriteByte(',')
			}
			br.describe(b, seen)
		}
		b.WriteByte(']')
	default:
		if s.decimal {
			fmt.Fprintf(b, `{"type":"bytes","decimal":[%d,%d]}`, s.precision, s.scale)
			return
		}
		b.WriteString(`"` + s.kind.String() + `"`)
	}
}
