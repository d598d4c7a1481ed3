package schemas_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemstream/idemstream/schemas"
)

const avroPipeline = "  - {name: p, input: claims, output: out, dlq: dlq, payload: avro, volatile: [/client_time]}\n"

func TestSchemaPayloadConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "claim.avsc"), []byte(`{"type":"record","name":"C","fields":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, yaml, field string
	}{
		{"avro without a registry", "pipelines:\n" + avroPipeline, "pipelines[0].payload"},
		{"a registry URL that is not http", "schema_registry: {url: 'ftp://x'}\npipelines:\n" + avroPipeline, "schema_registry.url"},
		{"a reader schema on json", "pipelines:\n  - {name: p, input: i, output: o, dlq: d, reader_schema: {subject: s}}\n", "pipelines[0].reader_schema"},
		{"a schema file on json", "pipelines:\n  - {name: p, input: i, output: o, dlq: d, schema_file: claim.avsc}\n", "pipelines[0].schema_file"},
		{"a schema file for json_schema", "pipelines:\n  - {name: p, input: i, output: o, dlq: d, payload: json_schema, schema_file: claim.avsc}\n", "pipelines[0].schema_file"},
		{"a schema file and a subject", "pipelines:\n  - {name: p, input: i, output: o, dlq: d, payload: avro, schema_file: claim.avsc, reader_schema: {subject: s}}\n", "pipelines[0].reader_schema"},
		{"a missing schema file", "pipelines:\n  - {name: p, input: i, output: o, dlq: d, payload: avro, schema_file: nope.avsc}\n", "pipelines[0].schema_file"},
		{"version zero", "schema_registry: {url: 'http://r'}\npipelines:\n  - {name: p, input: i, output: o, dlq: d, payload: avro, reader_schema: {version: 0}}\n", "pipelines[0].reader_schema.version"},
	} {
		_, err := schemas.Parse([]byte(c.yaml), dir)
		var fe *schemas.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: %v, want a field error on %s", c.name, err, c.field)
		}
	}
	ok := []string{
		"schema_registry: {url: 'http://registry:8081', timeout: 5s}\npipelines:\n" + avroPipeline,
		"schema_registry: {url: 'https://r', username: u, password_env: RP}\npipelines:\n  - {name: p, input: i, output: o, dlq: d, payload: protobuf, reader_schema: {subject: s, version: 3, message: coupon.v1.Claim}}\n",
		"pipelines:\n  - {name: p, input: i, output: o, dlq: d, payload: avro, schema_file: claim.avsc, key: {from: field, name: /id}}\n",
	}
	for _, y := range ok {
		if _, err := schemas.Parse([]byte(y), dir); err != nil {
			t.Errorf("%s: %v", y, err)
		}
	}
}

func TestContractNamesTheReaderSchema(t *testing.T) {
	cfg, err := schemas.Parse([]byte("schema_registry: {url: 'http://registry:8081'}\npipelines:\n"+avroPipeline), "")
	if err != nil {
		t.Fatal(err)
	}
	md, err := schemas.ContractMarkdown(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Commands are avro in the schema registry's wire format", "subject `claims-value` at its latest version", "keeps your retries replays", "`unknown_schema`"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the contract lacks %q:\n%s", want, md)
		}
	}
	api, err := schemas.ContractAsyncAPI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"application/vnd.apache.avro+binary", "readerSchema", "subject: claims-value"} {
		if !strings.Contains(string(api), want) {
			t.Errorf("the AsyncAPI document lacks %q", want)
		}
	}
}
