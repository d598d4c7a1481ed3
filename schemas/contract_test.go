package schemas_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/idemstream/idemstream/schemas"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "contract", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./schemas -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file; run go test ./schemas -update and review the diff.\ngot:\n%s", name, got)
	}
}

const threePipelines = `
pipelines:
  - name: coupon-claim
    input: coupon.claim.commands
    output: coupon.claim.results
    dlq: coupon.claim.dlq
    volatile: [/client_time, /retry_count, /trace_id]
    unordered: [/items]
  - name: order-create
    input: order.create.commands
    output: order.create.results
    dlq: order.create.dlq
    replies: order.create.replies
    key: {from: field, name: /request_id, format: 'regex:[A-Z]{3}-[0-9]{6}', max_length: 10}
    semantics: lenient
    window: 1h
    failed_ttl: 2m
  - name: retry-tolerant
    input: notify.commands
    output: notify.results
    dlq: notify.dlq
    key: {from: message_key, format: any}
    semantics: window
    clock: event
    payload: raw
`

func TestContractMarkdownGolden(t *testing.T) {
	cfg, err := schemas.Parse([]byte(threePipelines), "")
	if err != nil {
		t.Fatal(err)
	}
	md, err := schemas.ContractMarkdown(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "three-pipelines.md", md)
	// The five things docs/incident.md says, stated per pipeline.
	for _, section := range strings.Split(string(md), "\n## ")[1:] {
		for _, must := range []string{"**Key**", "**Semantics**", "**Window**", "**Volatile fields**", "**While pending**"} {
			if !strings.Contains(section, must) {
				t.Errorf("section %q lacks %s", strings.SplitN(section, "\n", 2)[0], must)
			}
		}
	}
}

func TestContractFollowsConfig(t *testing.T) {
	cfg, err := schemas.Parse([]byte(threePipelines), "")
	if err != nil {
		t.Fatal(err)
	}
	before, _ := schemas.ContractMarkdown(cfg)
	cfg.Pipelines[0].Window = schemas.Duration(42 * 60e9)
	cfg.Pipelines[0].Volatile = append(cfg.Pipelines[0].Volatile, "/device_id")
	after, _ := schemas.ContractMarkdown(cfg)
	if !strings.Contains(string(after), "**Window**: 42m") || !strings.Contains(string(after), "`/device_id`") {
		t.Errorf("contract does not follow the config:\n%s", after)
	}
	if bytes.Equal(before, after) {
		t.Error("changing the window and volatile fields left the contract unchanged")
	}
}

func TestContractAsyncAPI(t *testing.T) {
	cfg, err := schemas.Parse([]byte(threePipelines), "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := schemas.ContractAsyncAPI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "three-pipelines.asyncapi.yaml", out)

	var doc struct {
		AsyncAPI string `yaml:"asyncapi"`
		Channels map[string]struct {
			Address  string                       `yaml:"address"`
			Messages map[string]map[string]string `yaml:"messages"`
		} `yaml:"channels"`
		Operations map[string]struct {
			Action  string            `yaml:"action"`
			Channel map[string]string `yaml:"channel"`
		} `yaml:"operations"`
		Components struct {
			Messages map[string]struct {
				Idempotency map[string]any `yaml:"x-idempotency"`
			} `yaml:"messages"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.AsyncAPI != "3.0.0" {
		t.Errorf("asyncapi = %q", doc.AsyncAPI)
	}
	// Every reference must resolve inside the document.
	for name, op := range doc.Operations {
		ch := strings.TrimPrefix(op.Channel["$ref"], "#/channels/")
		if _, ok := doc.Channels[ch]; !ok {
			t.Errorf("operation %s refers to missing channel %q", name, ch)
		}
		if op.Action != "send" && op.Action != "receive" {
			t.Errorf("operation %s action %q", name, op.Action)
		}
	}
	for name, ch := range doc.Channels {
		for _, msg := range ch.Messages {
			m := strings.TrimPrefix(msg["$ref"], "#/components/messages/")
			if _, ok := doc.Components.Messages[m]; !ok {
				t.Errorf("channel %s refers to missing message %q", name, m)
			}
		}
	}
	if got := doc.Channels["order-create.replies"].Address; got != "order.create.replies" {
		t.Errorf("replies channel address = %q", got)
	}
	idem := doc.Components.Messages["coupon-claim.command"].Idempotency
	if idem["semantics"] != "strict" || idem["window"] != "10m" || idem["pendingTimeout"] != "30s" {
		t.Errorf("x-idempotency = %v", idem)
	}
}

// The HTTP routes' contract states the five things in HTTP's terms and
// every answer, and the OpenAPI fragment declares the key header and the
// answers the front door gives: both golden, both from the file.
func TestContractCoversHTTPRoutes(t *testing.T) {
	cfg, err := schemas.Load(filepath.Join("testdata", "http", "coupon.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	md, err := schemas.ContractMarkdown(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "http.md", md)
	for _, want := range []string{"`POST /api/coupon/claim`", "**Key**", "**Semantics**", "**Window**: 10m", "**Volatile fields**", "`X-Retry-Count`", "**While pending**", "`Retry-After: 2`", "2xx, 4xx", "header `X-Api-Key`"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("the markdown contract has no %s", want)
		}
	}
	api, err := schemas.ContractOpenAPI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "http.openapi.yaml", api)
	var doc struct {
		OpenAPI string `yaml:"openapi"`
		Paths   map[string]map[string]struct {
			Parameters []struct {
				Name     string `yaml:"name"`
				In       string `yaml:"in"`
				Required bool   `yaml:"required"`
			} `yaml:"parameters"`
			Responses map[string]struct {
				Headers map[string]any `yaml:"headers"`
			} `yaml:"responses"`
		} `yaml:"paths"`
	}
	if err := yaml.Unmarshal(api, &doc); err != nil {
		t.Fatal(err)
	}
	op := doc.Paths["/api/coupon/claim"]["post"]
	if doc.OpenAPI != "3.1.0" || len(op.Parameters) != 1 || op.Parameters[0].Name != "Idempotency-Key" || op.Parameters[0].In != "header" || !op.Parameters[0].Required {
		t.Fatalf("OpenAPI document %+v: want the required Idempotency-Key header on POST /api/coupon/claim", doc)
	}
	for _, code := range []string{"400", "409", "413", "422", "503"} {
		if _, ok := op.Responses[code]; !ok {
			t.Errorf("no %s answer", code)
		}
	}
	if op.Responses["409"].Headers["Retry-After"] == nil {
		t.Error("409 declares no Retry-After")
	}
	cfg.HTTP = nil
	if _, err := schemas.ContractOpenAPI(cfg); err == nil {
		t.Error("an OpenAPI contract of a file without routes")
	}
}
