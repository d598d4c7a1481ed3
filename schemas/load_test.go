package schemas_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemstream/idemstream/schemas"
)

const minimal = `
pipelines:
  - name: coupon-claim
    input: coupon.claim.commands
    output: coupon.claim.results
    dlq: coupon.claim.dlq
`

func TestSpecExampleLoads(t *testing.T) {
	cfg, err := schemas.Load("../deploy/examples/idemstream.yaml")
	if err != nil {
		t.Fatalf("the example config is refused: %v", err)
	}
	p, err := cfg.Pipeline("coupon-claim")
	if err != nil {
		t.Fatal(err)
	}
	if p.Window.D() != 10*time.Minute || p.Semantics != "strict" || p.Key.Name != "Idempotency-Key" {
		t.Errorf("pipeline = %+v", p)
	}
	if got := cfg.ConsumerGroup(p); got != "idemstream.coupon-claim" {
		t.Errorf("consumer group = %q, want idemstream.coupon-claim", got)
	}
	pol, err := cfg.Policy(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(pol.Rules.Volatile) != 4 || pol.PendingTimeout != 30*time.Second {
		t.Errorf("policy = %+v", pol)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := schemas.Parse([]byte(minimal), "")
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Pipelines[0]
	checks := map[string][2]any{
		"brokers":          {strings.Join(cfg.Kafka.Brokers, ","), "localhost:9092"},
		"group":            {cfg.Kafka.Group, "idemstream"},
		"store":            {cfg.Store.Kind, "redis"},
		"redis url":        {cfg.Store.Redis.URL, "redis://localhost:6379/0"},
		"prefix":           {cfg.Store.Redis.Prefix, "idem"},
		"min_replicas":     {cfg.Store.Redis.MinReplicas, 0},
		"replica_timeout":  {cfg.Store.Redis.ReplicaTimeout.D(), time.Second},
		"check_server":     {cfg.Store.Redis.ChecksServer(), true},
		"metrics":          {cfg.Metrics.Addr, ":9464"},
		"key from":         {p.Key.From, "header"},
		"key name":         {p.Key.Name, "Idempotency-Key"},
		"key format":       {p.Key.Format, "uuid"},
		"max length":       {p.Key.MaxLength, 128},
		"semantics":        {p.Semantics, "strict"},
		"window":           {p.Window.D(), 10 * time.Minute},
		"clock":            {p.Clock, "store"},
		"payload":          {p.Payload, "json"},
		"max payload":      {p.MaxPayloadBytes, 1 << 20},
		"pending_timeout":  {p.PendingTimeout.D(), 30 * time.Second},
		"failed_ttl":       {p.FailedTTL.D(), 10 * time.Minute},
		"retry interval":   {p.ClientMaxRetryInterval.D(), 30 * time.Second},
		"group of the run": {cfg.ConsumerGroup(p), "idemstream.coupon-claim"},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("default %s = %v, want %v", name, c[0], c[1])
		}
	}
	win, err := schemas.Parse([]byte(strings.Replace(minimal, "dlq: coupon.claim.dlq", "dlq: coupon.claim.dlq\n    semantics: window\n    group: custom", 1)), "")
	if err != nil {
		t.Fatal(err)
	}
	if w := win.Pipelines[0].Window.D(); w != 5*time.Minute {
		t.Errorf("window semantics default window = %v, want 5m", w)
	}
	if g := win.ConsumerGroup(win.Pipelines[0]); g != "custom" {
		t.Errorf("explicit group = %q", g)
	}
}

// pipeline returns a config whose single pipeline has extra lines.
func pipeline(extra string) string {
	return minimal + "    " + strings.ReplaceAll(strings.TrimSpace(extra), "\n", "\n    ") + "\n"
}

// route is a file with one HTTP route, named claim on POST /claim, and
// the given fields.
func route(fields string) string {
	r := "http:\n  routes:\n    - name: claim\n      path: /claim\n"
	if fields != "" {
		r += "      " + fields + "\n"
	}
	return r
}

func TestRefusedConfigsNameTheField(t *testing.T) {
	cases := []struct {
		name, yaml, field, msg string
	}{
		{"unknown top key", minimal + "kafak: {}\n", "", `unknown key: 'kafak'`},
		{"unknown pipeline key", pipeline("windw: 10m"), "pipelines[0]", "'windw'"},
		{"unknown nested key", pipeline("key: {form: header}"), "pipelines[0].key", "'form'"},
		{"bad duration", pipeline("window: 10 minutes"), "pipelines[0].window", "not a duration"},
		{"zero duration", pipeline("pending_timeout: 0s"), "pipelines[0].pending_timeout", "longer than zero"},
		{"bad pointer syntax", pipeline("volatile: [client_time]"), "pipelines[0].volatile[0]", "not a JSON Pointer"},
		{"bad pointer escape", pipeline("volatile: [/a~2b]"), "pipelines[0].volatile[0]", "not a JSON Pointer"},
		{"bad unordered pointer", pipeline("unordered: [items]"), "pipelines[0].unordered[0]", "not a JSON Pointer"},
		{"output equals input", strings.Replace(minimal, "output: coupon.claim.results", "output: coupon.claim.commands", 1), "pipelines[0].output", "also the input topic"},
		{"dlq equals input", strings.Replace(minimal, "dlq: coupon.claim.dlq", "dlq: coupon.claim.commands", 1), "pipelines[0].dlq", "also the input topic"},
		{"dlq equals output", strings.Replace(minimal, "dlq: coupon.claim.dlq", "dlq: coupon.claim.results", 1), "pipelines[0].dlq", "also the output topic"},
		{"window too short", pipeline("window: 40s\nclient_max_retry_interval: 30s"), "pipelines[0].window", "1.5 × client_max_retry_interval (30s) = 45s"},
		{"default window too short", pipeline("semantics: window\nclient_max_retry_interval: 5m"), "pipelines[0].window", "shorter than 1.5"},
		{"bad semantics", pipeline("semantics: exactly"), "pipelines[0].semantics", "strict"},
		{"bad key format", pipeline("key: {format: uuid4}"), "pipelines[0].key.format", "unknown key format"},
		{"bad regex", pipeline("key: {format: 'regex:[a-'}"), "pipelines[0].key.format", "error parsing regexp"},
		{"field key needs pointer", pipeline("key: {from: field, name: order_id}"), "pipelines[0].key.name", ""},
		{"field key wildcard", pipeline("key: {from: field, name: /items/*}"), "pipelines[0].key.name", "wildcard"},
		{"raw with volatile", pipeline("payload: raw\nvolatile: [/a]"), "pipelines[0].volatile", "byte for byte"},
		{"raw with field key", pipeline("payload: raw\nkey: {from: field, name: /id}"), "pipelines[0].key.from", "payload: json"},
		{"missing schema file", pipeline("schema: nowhere.json"), "pipelines[0].schema", "cannot read"},
		{"bad topic", strings.Replace(minimal, "input: coupon.claim.commands", "input: 'coupon claim'", 1), "pipelines[0].input", "letters, digits"},
		{"missing output", strings.Replace(minimal, "    output: coupon.claim.results\n", "", 1), "pipelines[0]", "output"},
		{"duplicate names", minimal + strings.TrimPrefix(strings.Replace(minimal, "coupon.claim.", "other.", -1), "\npipelines:\n"), "pipelines[1].name", "already the name"},
		{"shared output", minimal + "  - {name: other, input: other.commands, output: coupon.claim.results, dlq: other.dlq}\n", "pipelines[1].output", "already the output of pipelines[0]"},
		{"output is another's dlq", minimal + "  - {name: other, input: other.commands, output: coupon.claim.dlq, dlq: other.dlq}\n", "pipelines[1].output", "dead-letter or replies topic of pipelines[0]"},
		{"bad store", minimal + "store: {kind: etcd}\n", "store.kind", "redis"},
		{"bad broker", minimal + "kafka: {brokers: [localhost]}\n", "kafka.brokers[0]", "host:port"},
		{"bad redis url", minimal + "store: {redis: {url: 'http://x'}}\n", "store.redis.url", ""},
		{"negative min_replicas", minimal + "store: {redis: {min_replicas: -1}}\n", "store.redis.min_replicas", "minimum"},
		{"min_replicas not a number", minimal + "store: {redis: {min_replicas: one}}\n", "store.redis.min_replicas", "integer"},
		{"zero replica_timeout", minimal + "store: {redis: {min_replicas: 1, replica_timeout: 0s}}\n", "store.redis.replica_timeout", "longer than zero"},
		{"bad replica_timeout", minimal + "store: {redis: {replica_timeout: soon}}\n", "store.redis.replica_timeout", "not a duration"},
		{"check_server not a boolean", minimal + "store: {redis: {check_server: maybe}}\n", "store.redis.check_server", "boolean"},
		{"unknown entry_format", minimal + "store: {redis: {entry_format: binary}}\n", "store.redis.entry_format", "compact"},
		{"bad sasl", minimal + "kafka: {sasl: {mechanism: md5, username: u, password_env: P}}\n", "kafka.sasl.mechanism", ""},
		{"no pipelines", "kafka: {group: g}\n", "", "pipelines"},
		{"empty file", "", "", "empty"},
		{"not a mapping", "- a\n- b\n", "", "mapping"},
		{"not yaml", "pipelines: [\n", "", "not valid YAML"},
		{"key given twice", minimal + "kafka: {}\nkafka: {}\n", "kafka", "key given twice"},
		{"wrong type", pipeline("max_payload_bytes: lots"), "pipelines[0].max_payload_bytes", "want integer"},
		{"duplicate route", route("") + "    - {name: claim, path: /b}\n", "http.routes[1].name", "already the name"},
		{"same route twice", route("") + "    - {name: other, path: /claim}\n", "http.routes[1].path", "already the route"},
		{"bad route pattern", "http:\n  routes:\n    - {name: claim, path: '/a/{id'}\n", "http.routes[0].path", "bad wildcard"},
		{"route window too short", route("window: 40s"), "http.routes[0].window", "1.5 × client_max_retry_interval"},
		{"route window inside two leases", route("window: 1m"), "http.routes[0].window", "twice the lease"},
		{"route replays its key header", route("replay_headers: [idempotency-key]"), "http.routes[0].replay_headers", "not an answer header"},
		{"route stores a class that is not one", route("store_responses: [200]"), "http.routes[0].store_responses[0]", ""},
		{"route key from a field", route("key: {from: field}"), "http.routes[0].key.from", ""},
		{"bad upstream", "http: {upstream: 'localhost:9000', routes: [{name: a, path: /a}]}\n", "http.upstream", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := schemas.Parse([]byte(tc.yaml), t.TempDir())
			if err == nil {
				t.Fatalf("config accepted:\n%s", tc.yaml)
			}
			var fe *schemas.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %T %q is not a *FieldError", err, err)
			}
			if fe.Field != tc.field {
				t.Errorf("field = %q, want %q (error: %v)", fe.Field, tc.field, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}

func TestOverridesPrecedence(t *testing.T) {
	file := minimal + "kafka: {brokers: [file:9092], group: from-file}\nstore: {redis: {url: 'redis://file:6379/0'}}\n"
	env := map[string]string{
		"IDEMSTREAM_KAFKA_BROKERS": "env-a:9092, env-b:9092",
		"IDEMSTREAM_KAFKA_GROUP":   "from-env",
		"IDEMSTREAM_REDIS_URL":     "redis://env:6379/1",
	}
	flags := schemas.Overrides{"kafka.group": "from-flag"}
	cfg, err := schemas.Parse([]byte(file), "", schemas.EnvOverrides(func(k string) string { return env[k] }), flags)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Kafka.Brokers, ","); got != "env-a:9092,env-b:9092" {
		t.Errorf("brokers = %q, want the environment's", got)
	}
	if cfg.Kafka.Group != "from-flag" {
		t.Errorf("group = %q, want the flag's", cfg.Kafka.Group)
	}
	if cfg.Store.Redis.URL != "redis://env:6379/1" {
		t.Errorf("redis url = %q", cfg.Store.Redis.URL)
	}
	if cfg.ConsumerGroup(cfg.Pipelines[0]) != "from-flag.coupon-claim" {
		t.Errorf("consumer group ignores the override: %q", cfg.ConsumerGroup(cfg.Pipelines[0]))
	}
	_, err = schemas.Parse([]byte(minimal), "", schemas.Overrides{"store.kind": "etcd"})
	var fe *schemas.FieldError
	if !errors.As(err, &fe) || fe.Field != "store.kind" {
		t.Errorf("a bad override is reported as %v, want a field error on store.kind", err)
	}
}

func TestPayloadSchemaViolation(t *testing.T) {
	dir := t.TempDir()
	schema := `{"type":"object","required":["coupon_id"],"properties":{"coupon_id":{"type":"integer"}}}`
	if err := os.WriteFile(filepath.Join(dir, "claim.schema.json"), []byte(schema), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := schemas.Parse([]byte(pipeline("schema: claim.schema.json")), dir)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := cfg.Policy(cfg.Pipelines[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := pol.Schema.ValidatePayload([]byte(`{"coupon_id": 12345}`)); err != nil {
		t.Errorf("valid payload refused: %v", err)
	}
	err = pol.Schema.ValidatePayload([]byte(`{"coupon_id": "12345"}`))
	if err == nil || !strings.Contains(err.Error(), "/coupon_id") {
		t.Errorf("violation reported as %v, want one naming /coupon_id", err)
	}
	if err := pol.Schema.ValidatePayload([]byte(`{}`)); err == nil {
		t.Error("missing required member accepted")
	}
}

func TestEmbeddedSchemasAreJSON(t *testing.T) {
	for name, b := range map[string][]byte{"config": schemas.ConfigSchema, "result": schemas.ResultSchema, "dlq": schemas.DLQSchema} {
		if !strings.Contains(string(b), `"$schema"`) {
			t.Errorf("%s schema is not embedded", name)
		}
	}
}
