package schemas

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// ConfigReference renders the configuration reference (docs/configuration.md)
// from ConfigSchema: every field with its type, default and meaning, in
// the order of the file. The schema is the one source: the loader
// validates against it, and a test keeps the document equal to this
// rendering.
func ConfigReference() (string, error) {
	var root schemaNode
	if err := json.Unmarshal(ConfigSchema, &root); err != nil {
		return "", fmt.Errorf("config schema: %w", err)
	}
	var b strings.Builder
	b.WriteString("# Configuration reference\n\n")
	b.WriteString("<!-- Generated from schemas/config.schema.json by schemas.ConfigReference; `go test ./schemas -run TestConfigurationReference -update` writes it again. -->\n\n")
	b.WriteString(root.Description + "\n\n")
	b.WriteString("Flags and `IDEMSTREAM_*` environment variables override a few fields (`idemstream run -h`); pipelines are only ever read from the file. ")
	b.WriteString("Durations are Go durations (`500ms`, `30s`, `10m`, `1h30m`); pointers are RFC 6901 JSON Pointers, where a segment of exactly `*` matches any array index or member name.\n\n")
	b.WriteString("| field | type | default | meaning |\n|---|---|---|---|\n")
	var walk func(path string, n *schemaNode) error
	walk = func(path string, n *schemaNode) error {
		for _, name := range n.order() {
			p := n.Properties[name]
			field := name
			if path != "" {
				field = path + "." + name
			}
			r := root.resolve(p)
			if p.Description == "" && r.Description == "" {
				return fmt.Errorf("config schema: %s has no description", field)
			}
			desc := p.Description
			if desc == "" {
				desc = r.Description
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", field, root.typeOf(p), defaultOf(p), escapeCell(desc))
			switch {
			case r.Type == "object" && len(r.Properties) > 0:
				if err := walk(field, r); err != nil {
					return err
				}
			case r.Type == "array" && r.Items != nil && len(root.resolve(r.Items).Properties) > 0:
				if err := walk(field+"[]", root.resolve(r.Items)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk("", &root); err != nil {
		return "", err
	}
	return b.String(), nil
}

// schemaNode is the part of a JSON Schema the reference reads.
type schemaNode struct {
	Ref         string                 `json:"$ref"`
	Type        string                 `json:"type"`
	Description string                 `json:"description"`
	Default     json.RawMessage        `json:"default"`
	Enum        []string               `json:"enum"`
	Pattern     string                 `json:"pattern"`
	Minimum     *float64               `json:"minimum"`
	Maximum     *float64               `json:"maximum"`
	Items       *schemaNode            `json:"items"`
	AnyOf       []*schemaNode          `json:"anyOf"`
	Properties  map[string]*schemaNode `json:"properties"`
	Defs        map[string]*schemaNode `json:"$defs"`
	keys        []string
}

// UnmarshalJSON keeps the order of properties as the file has them.
func (n *schemaNode) UnmarshalJSON(data []byte) error {
	type plain schemaNode
	if err := json.Unmarshal(data, (*plain)(n)); err != nil {
		return err
	}
	var raw struct {
		Properties json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(data, &raw); err != nil || len(raw.Properties) == 0 {
		return err
	}
	dec := json.NewDecoder(strings.NewReader(string(raw.Properties)))
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch t := tok.(type) {
		case json.Delim:
			if t == '{' || t == '[' {
				depth++
			} else {
				depth--
			}
		case string:
			if depth == 1 {
				n.keys = append(n.keys, t)
				// Skip the value.
				var skip json.RawMessage
				if err := dec.Decode(&skip); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func (n *schemaNode) order() []string {
	if len(n.keys) == len(n.Properties) {
		return n.keys
	}
	keys := make([]string, 0, len(n.Properties))
	for k := range n.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (root *schemaNode) resolve(n *schemaNode) *schemaNode {
	if name, ok := strings.CutPrefix(n.Ref, "#/$defs/"); ok {
		if d := root.Defs[name]; d != nil {
			return d
		}
	}
	return n
}

func (root *schemaNode) typeOf(n *schemaNode) string {
	if name, ok := strings.CutPrefix(n.Ref, "#/$defs/"); ok {
		switch name {
		case "duration", "pointer", "topic":
			return name
		case "name":
			return "name"
		}
	}
	r := root.resolve(n)
	switch {
	case len(r.Enum) > 0:
		return "`" + strings.Join(r.Enum, "` \\| `") + "`"
	case len(r.AnyOf) > 0:
		return root.typeOf(r.AnyOf[len(r.AnyOf)-1])
	case r.Type == "array" && r.Items != nil:
		return "list of " + root.typeOf(r.Items)
	case r.Type == "integer" && r.Minimum != nil && r.Maximum != nil:
		return fmt.Sprintf("integer %s–%s", strconv.FormatFloat(*r.Minimum, 'f', -1, 64), strconv.FormatFloat(*r.Maximum, 'f', -1, 64))
	}
	return r.Type
}

func defaultOf(n *schemaNode) string {
	if len(n.Default) == 0 {
		return ""
	}
	return "`" + string(n.Default) + "`"
}

func escapeCell(s string) string {
	return strings.NewReplacer("|", "\\|", "<", "&lt;", ">", "&gt;").Replace(s)
}
