package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// FieldError is a configuration error about one field. Field is a path
// such as pipelines[0].window.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "config: " + e.Msg
	}
	return "config: " + e.Field + ": " + e.Msg
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Overrides replace configuration values after the file is read. Keys are
// dotted field paths (see OverridableFields); values are strings, as they
// come from flags and environment variables.
type Overrides map[string]string

// OverridableField is a field that a flag or an environment variable can
// set without editing the file.
type OverridableField struct {
	Path string // dotted path in the file
	Env  string // environment variable
	Flag string // command-line flag
	List bool   // comma-separated list
	Help string
}

// OverridableFields lists every field settable from the environment or
// flags. Pipelines are not: they are the contract, kept in the file.
var OverridableFields = []OverridableField{
	{Path: "kafka.brokers", Env: "IDEMSTREAM_KAFKA_BROKERS", Flag: "brokers", List: true, Help: "Kafka bootstrap brokers, comma-separated"},
	{Path: "kafka.group", Env: "IDEMSTREAM_KAFKA_GROUP", Flag: "group", Help: "consumer group prefix"},
	{Path: "kafka.client_id", Env: "IDEMSTREAM_KAFKA_CLIENT_ID", Flag: "client-id", Help: "Kafka client id"},
	{Path: "kafka.instance_id", Env: "IDEMSTREAM_KAFKA_INSTANCE_ID", Flag: "instance-id", Help: "static group member id (the pod name): a restart takes its partitions back without a rebalance"},
	{Path: "store.kind", Env: "IDEMSTREAM_STORE_KIND", Flag: "store", Help: "state store: redis or memory"},
	{Path: "store.redis.url", Env: "IDEMSTREAM_REDIS_URL", Flag: "redis-url", Help: "Redis URL (redis:// or rediss://)"},
	{Path: "store.redis.prefix", Env: "IDEMSTREAM_REDIS_PREFIX", Flag: "redis-prefix", Help: "prefix of every Redis key"},
	{Path: "store.redis.entry_format", Env: "IDEMSTREAM_REDIS_ENTRY_FORMAT", Flag: "redis-entry-format", Help: "how new entries are written: text or compact"},
	{Path: "metrics.addr", Env: "IDEMSTREAM_METRICS_ADDR", Flag: "metrics-addr", Help: "listen address of /metrics, /healthz and /readyz"},
}

// FlagEnv is the environment variable named after the field's flag
// (--brokers: IDEMSTREAM_BROKERS). It is read beside Env, and wins.
func (f OverridableField) FlagEnv() string {
	return "IDEMSTREAM_" + strings.ToUpper(strings.ReplaceAll(f.Flag, "-", "_"))
}

// EnvOverrides reads the IDEMSTREAM_* variables that are set.
func EnvOverrides(getenv func(string) string) Overrides {
	ov, _ := EnvOverridesFrom(getenv)
	return ov
}

// EnvOverridesFrom is EnvOverrides, and for each field set the variable
// it came from, so that an error about the value can name it.
func EnvOverridesFrom(getenv func(string) string) (Overrides, map[string]string) {
	ov, from := Overrides{}, map[string]string{}
	for _, f := range OverridableFields {
		for _, name := range []string{f.Env, f.FlagEnv()} {
			if v := getenv(name); v != "" {
				ov[f.Path], from[f.Path] = v, name
			}
		}
	}
	return ov, from
}

// Load reads, overrides, validates and completes a configuration file.
// Every error it returns for a bad file is a *FieldError.
func Load(path string, ov ...Overrides) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &FieldError{Msg: fmt.Sprintf("read %s: %v", path, errors.Unwrap(err))}
	}
	return Parse(data, filepath.Dir(path), ov...)
}

// Parse is Load for a file already read; dir resolves relative paths.
func Parse(data []byte, dir string, ov ...Overrides) (*Config, error) {
	tree, err := yamlTree(data)
	if err != nil {
		return nil, err
	}
	for _, o := range ov {
		if err := applyOverrides(tree, o); err != nil {
			return nil, err
		}
	}
	if err := validateTree(tree); err != nil {
		return nil, err
	}
	if err := refuseZeroDurations(tree); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(tree)
	if err != nil {
		return nil, &FieldError{Msg: err.Error()}
	}
	cfg := &Config{Dir: dir}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return nil, decodeError(err)
	}
	cfg.applyDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func yamlTree(data []byte) (map[string]any, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &FieldError{Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if len(doc.Content) == 0 {
		return nil, &FieldError{Msg: "the file is empty: it needs at least one pipeline"}
	}
	v, err := nodeValue(doc.Content[0], "")
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &FieldError{Msg: "the file must be a mapping with kafka, store, metrics and pipelines"}
	}
	return m, nil
}

// nodeValue converts YAML into the JSON data model, refusing what JSON
// cannot say (non-string keys, anchors merging maps) instead of guessing.
func nodeValue(n *yaml.Node, path string) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return nodeValue(n.Alias, path)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
				return nil, fieldErr(path, "line %d: only plain string keys are allowed", k.Line)
			}
			child := joinPath(path, k.Value)
			if _, dup := m[k.Value]; dup {
				return nil, fieldErr(child, "line %d: key given twice", k.Line)
			}
			v, err := nodeValue(n.Content[i+1], child)
			if err != nil {
				return nil, err
			}
			m[k.Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, 0, len(n.Content))
		for i, c := range n.Content {
			v, err := nodeValue(c, path+"["+strconv.Itoa(i)+"]")
			if err != nil {
				return nil, err
			}
			s = append(s, v)
		}
		return s, nil
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, fieldErr(path, "line %d: %v", n.Line, err)
		}
		if f, ok := v.(float64); ok && f == float64(int64(f)) && !strings.ContainsAny(n.Value, ".eE") {
			return int64(f), nil
		}
		return v, nil
	}
	return nil, fieldErr(path, "line %d: unsupported YAML node", n.Line)
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func applyOverrides(tree map[string]any, ov Overrides) error {
	for _, f := range OverridableFields {
		v, ok := ov[f.Path]
		if !ok {
			continue
		}
		parts := strings.Split(f.Path, ".")
		m := tree
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				if m[p] != nil {
					return fieldErr(f.Path, "cannot override: %s is not a mapping", p)
				}
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		if f.List {
			items := []any{}
			for _, s := range strings.Split(v, ",") {
				if s = strings.TrimSpace(s); s != "" {
					items = append(items, s)
				}
			}
			m[parts[len(parts)-1]] = items
		} else {
			m[parts[len(parts)-1]] = v
		}
	}
	return nil
}

var (
	compileOnce    sync.Once
	compiledSchema *jsonschema.Schema
	compileErr     error
)

func configSchema() (*jsonschema.Schema, error) {
	compileOnce.Do(func() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(ConfigSchema))
		if err != nil {
			compileErr = err
			return
		}
		c := jsonschema.NewCompiler()
		const url = "config.schema.json"
		if err := c.AddResource(url, doc); err != nil {
			compileErr = err
			return
		}
		compiledSchema, compileErr = c.Compile(url)
	})
	return compiledSchema, compileErr
}

var printer = message.NewPrinter(language.English)

func validateTree(tree map[string]any) error {
	sch, err := configSchema()
	if err != nil {
		return fmt.Errorf("embedded config schema: %w", err)
	}
	var doc any = tree
	// The validator wants the JSON data model exactly: round-trip once.
	raw, err := json.Marshal(tree)
	if err != nil {
		return &FieldError{Msg: err.Error()}
	}
	if doc, err = jsonschema.UnmarshalJSON(bytes.NewReader(raw)); err != nil {
		return &FieldError{Msg: err.Error()}
	}
	err = sch.Validate(doc)
	var verr *jsonschema.ValidationError
	if !errors.As(err, &verr) {
		return err
	}
	leaf := deepestCause(verr)
	return &FieldError{Field: locationPath(leaf.InstanceLocation), Msg: describe(leaf, tree)}
}

// deepestCause follows the first chain of causes to the most specific
// complaint, which is the one a person can act on.
func deepestCause(e *jsonschema.ValidationError) *jsonschema.ValidationError {
	for len(e.Causes) > 0 {
		best := e.Causes[0]
		for _, c := range e.Causes[1:] {
			if len(c.InstanceLocation) > len(best.InstanceLocation) {
				best = c
			}
		}
		e = best
	}
	return e
}

func locationPath(loc []string) string {
	var b strings.Builder
	for _, seg := range loc {
		if _, err := strconv.Atoi(seg); err == nil {
			b.WriteString("[" + seg + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(seg)
	}
	return b.String()
}

func describe(e *jsonschema.ValidationError, tree map[string]any) string {
	msg := e.ErrorKind.LocalizedString(printer)
	switch k := e.ErrorKind.(type) {
	case interface{ KeywordPath() []string }:
		kw := k.KeywordPath()
		if len(kw) == 0 {
			break
		}
		switch kw[0] {
		case "additionalProperties":
			return "unknown key: " + strings.TrimPrefix(msg, "additional properties ")
		case "pattern":
			return fmt.Sprintf("%s: %s", valueAt(tree, e.InstanceLocation), hintFor(e.InstanceLocation, msg))
		}
	}
	return msg
}

func hintFor(loc []string, fallback string) string {
	last := ""
	if len(loc) > 0 {
		last = loc[len(loc)-1]
	}
	if len(loc) >= 2 {
		if _, err := strconv.Atoi(last); err == nil {
			last = loc[len(loc)-2]
		}
	}
	switch last {
	case "window", "pending_timeout", "failed_ttl", "client_max_retry_interval", "replica_timeout":
		return "not a duration (use 500ms, 30s, 10m, 1h)"
	case "volatile", "unordered":
		return "not a JSON Pointer (RFC 6901: /field/sub, ~0 for ~, ~1 for /, * for any segment)"
	case "format":
		return "unknown key format: want uuid, any or regex:<RE2>"
	case "brokers", "addrs", "addr":
		return "want host:port"
	case "name", "group", "input", "output", "dlq", "replies":
		return "only letters, digits, '.', '_' and '-' are allowed"
	}
	return fallback
}

func valueAt(tree map[string]any, loc []string) string {
	var cur any = tree
	for _, seg := range loc {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[seg]
		case []any:
			i, _ := strconv.Atoi(seg)
			if i >= 0 && i < len(c) {
				cur = c[i]
			}
		}
	}
	b, _ := json.Marshal(cur)
	return string(b)
}

func decodeError(err error) error {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		return fieldErr(ute.Field, "want %s", ute.Type)
	}
	msg := err.Error()
	// json reports custom unmarshaler failures as "json: cannot unmarshal ... into Go struct field Config.pipelines.window of type ..."
	// with the message of UnmarshalJSON last.
	return &FieldError{Msg: strings.TrimPrefix(msg, "json: ")}
}

// refuseZeroDurations tells an explicit 0s apart from an absent field,
// which gets its default: a zero window or lease would disable dedupe
// without a word.
func refuseZeroDurations(tree map[string]any) error {
	store, _ := tree["store"].(map[string]any)
	redis, _ := store["redis"].(map[string]any)
	if s, ok := redis["replica_timeout"].(string); ok {
		if d, err := time.ParseDuration(s); err == nil && d <= 0 {
			return fieldErr("store.redis.replica_timeout", "%s: must be longer than zero (WAIT 0 would wait for ever)", s)
		}
	}
	pipes, _ := tree["pipelines"].([]any)
	for i, p := range pipes {
		m, _ := p.(map[string]any)
		for _, field := range []string{"window", "pending_timeout", "failed_ttl", "client_max_retry_interval"} {
			s, ok := m[field].(string)
			if !ok {
				continue
			}
			if d, err := time.ParseDuration(s); err == nil && d <= 0 {
				return fieldErr(fmt.Sprintf("pipelines[%d].%s", i, field), "%s: must be longer than zero", s)
			}
		}
	}
	return nil
}
