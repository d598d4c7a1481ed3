package schemas_test

import (
	"encoding/json"

	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/schemas"
)

const referencePath = "../docs/configuration.md"

// docs/configuration.md is the rendering of the schema: every field
// described, and the document never drifts from the schema the loader
// validates against.
func TestConfigurationReferenceIsCurrent(t *testing.T) {
	got, err := schemas.ConfigReference()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(referencePath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the schema's rendering: run go test ./schemas -run TestConfigurationReference -update", filepath.Clean(referencePath))
	}
	for _, field := range []string{"`kafka.compression`", "`pipelines[].start`", "`store.redis.min_replicas`", "`pipelines[].key.format`"} {
		if !strings.Contains(got, "| "+field+" |") {
			t.Errorf("the reference has no row for %s", field)
		}
	}
}

// The defaults the schema states are the ones the loader applies.
func TestSchemaDefaultsAreTheLoadersDefaults(t *testing.T) {
	cfg, err := schemas.Parse([]byte("pipelines: [{name: p, input: in, output: out, dlq: dlq}]\n"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var loaded map[string]any
	if err := json.Unmarshal(raw, &loaded); err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(schemas.ConfigSchema, &schema); err != nil {
		t.Fatal(err)
	}
	defs := schema["$defs"].(map[string]any)
	checked := 0
	var walk func(path string, props map[string]any, value map[string]any)
	walk = func(path string, props map[string]any, value map[string]any) {
		for name, p := range props {
			node := p.(map[string]any)
			field := strings.TrimPrefix(path+"."+name, ".")
			got, present := value[name]
			if def, ok := node["default"]; ok {
				checked++
				if !present {
					got = zeroLike(def)
				}
				if !reflect.DeepEqual(normalize(got), normalize(def)) {
					t.Errorf("%s: the schema says the default is %v, the loader gives %v", field, def, got)
				}
			}
			if ref, ok := node["$ref"].(string); ok {
				node = defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
			}
			sub, _ := value[name].(map[string]any)
			if inner, ok := node["properties"].(map[string]any); ok && sub != nil {
				walk(field, inner, sub)
			}
			if items, ok := node["items"].(map[string]any); ok {
				if ref, ok := items["$ref"].(string); ok {
					items = defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
				}
				list, _ := value[name].([]any)
				if inner, ok := items["properties"].(map[string]any); ok && len(list) > 0 {
					walk(field+"[]", inner, list[0].(map[string]any))
				}
			}
		}
	}
	walk("", schema["properties"].(map[string]any), loaded)
	if checked < 25 {
		t.Errorf("only %d defaults checked", checked)
	}
}

// zeroLike is what an omitted field of def's kind holds.
func zeroLike(def any) any {
	switch def.(type) {
	case bool:
		return false
	case float64:
		return 0.0
	case string:
		return ""
	case []any:
		return []any{}
	}
	return nil
}

func normalize(v any) any {
	if v == nil {
		return []any{}
	}
	if s, ok := v.(string); ok {
		switch s { // durations as the loader writes them
		case "10m0s":
			return "10m"
		case "30s", "1s", "10m":
			return s
		}
	}
	return v
}
