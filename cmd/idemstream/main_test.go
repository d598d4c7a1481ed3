package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/schemas"
)

const exampleConfig = "../../deploy/examples/idemstream.yaml"

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errOut, func(string) string { return "" })
	return result{code, out.String(), errOut.String()}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var fingerprintRE = regexp.MustCompile(`fingerprint: (sha256:[0-9a-f]{64})`)

func hash(t *testing.T, payload string) string {
	t.Helper()
	r := runCLI(t, payload, "hash", "--config", exampleConfig, "--pipeline", "coupon-claim", "-")
	if r.code != 0 {
		t.Fatalf("hash exited %d: %s", r.code, r.stderr)
	}
	m := fingerprintRE.FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("no fingerprint in %q", r.stdout)
	}
	return m[1]
}

// The acceptance checks of the foundation, through the real command line.
func TestHashIgnoresWhatDoesNotMakeARequestDifferent(t *testing.T) {
	base := hash(t, `{"user_id":"u-1","coupon_id":12345,"amount":50,"note":"u","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`)
	same := map[string]string{
		"member order":   `{"items":[{"qty":1,"sku":"A"},{"sku":"B","qty":2}],"note":"u","amount":50,"coupon_id":12345,"user_id":"u-1"}`,
		"whitespace":     "{\n  \"user_id\" : \"u-1\",\t\"coupon_id\": 12345, \"amount\": 50, \"note\": \"u\",\r\n \"items\": [ {\"sku\": \"A\", \"qty\": 1}, {\"sku\": \"B\", \"qty\": 2} ] }",
		"50.0":           `{"user_id":"u-1","coupon_id":12345,"amount":50.0,"note":"u","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`,
		"5e1":            `{"user_id":"u-1","coupon_id":12345,"amount":5e1,"note":"u","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`,
		"escape":         `{"user_id":"u-1","coupon_id":12345,"amount":50,"note":"\u0075","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`,
		"volatile":       `{"user_id":"u-1","coupon_id":12345,"amount":50,"note":"u","items":[{"sku":"A","qty":1,"client_ts":9},{"sku":"B","qty":2,"client_ts":8}],"client_time":"10:00:03","retry_count":2,"trace_id":"t"}`,
		"unordered list": `{"user_id":"u-1","coupon_id":12345,"amount":50,"note":"u","items":[{"sku":"B","qty":2},{"sku":"A","qty":1}]}`,
	}
	for name, payload := range same {
		if got := hash(t, payload); got != base {
			t.Errorf("%s changed the fingerprint: %s, want %s", name, got, base)
		}
	}
	if got := hash(t, `{"user_id":"u-1","coupon_id":12345,"amount":51,"note":"u","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`); got == base {
		t.Error("another amount kept the fingerprint")
	}
}

func TestHashOrderedArrayOrderMatters(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", "pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, unordered: [/tags]}\n")
	fp := func(payload string) string {
		r := runCLI(t, payload, "hash", "--config", cfg, "-")
		if r.code != 0 {
			t.Fatalf("hash: %d %s", r.code, r.stderr)
		}
		return fingerprintRE.FindStringSubmatch(r.stdout)[1]
	}
	if fp(`{"tags":["x","y"],"steps":["a","b"]}`) != fp(`{"tags":["y","x"],"steps":["a","b"]}`) {
		t.Error("reordering an unordered array changed the fingerprint")
	}
	if fp(`{"tags":["x","y"],"steps":["a","b"]}`) == fp(`{"tags":["x","y"],"steps":["b","a"]}`) {
		t.Error("reordering an ordered array kept the fingerprint")
	}
}

func TestHashExampleFiles(t *testing.T) {
	first := runCLI(t, "", "hash", "--config", exampleConfig, "--pipeline", "coupon-claim", "../../deploy/examples/claim-first.json")
	retry := runCLI(t, "", "hash", "../../deploy/examples/claim-retry.json", "--config", exampleConfig)
	if first.code != 0 || retry.code != 0 {
		t.Fatalf("hash exited %d/%d: %s %s", first.code, retry.code, first.stderr, retry.stderr)
	}
	if first.stdout != retry.stdout {
		t.Errorf("the example retry hashes differently:\n%s\n%s", first.stdout, retry.stdout)
	}
	if !strings.Contains(first.stdout, `canonical:   {"amount":50,"coupon_id":12345,"items":[{"qty":1,"sku":"A-1"},{"qty":2,"sku":"B-2"}],"note":"urgent","user_id":"u-1024"}`) {
		t.Errorf("canonical form not shown as expected:\n%s", first.stdout)
	}
}

func TestHashMalformedPayload(t *testing.T) {
	r := runCLI(t, `{"amount": 50, "amount": 100}`, "hash", "--config", exampleConfig, "-")
	if r.code != 1 || !strings.Contains(r.stderr, "malformed payload") || !strings.Contains(r.stderr, "amount") {
		t.Errorf("exit %d, stderr %q; want 1 and a malformed payload error naming the member", r.code, r.stderr)
	}
}

func TestDiffNamesAmount(t *testing.T) {
	r := runCLI(t, "", "diff", "--config", exampleConfig, "--pipeline", "coupon-claim",
		"../../deploy/examples/claim-first.json", "../../deploy/examples/claim-changed-amount.json")
	if r.code != 0 {
		t.Fatalf("diff exited %d: %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if last := lines[len(lines)-1]; last != "/amount" || !strings.Contains(r.stdout, "differs at 1 path") {
		t.Errorf("diff output:\n%s\nwant /amount as the only path", r.stdout)
	}
	same := runCLI(t, "", "diff", "--config", exampleConfig,
		"../../deploy/examples/claim-first.json", "../../deploy/examples/claim-retry.json")
	if same.code != 0 || !strings.Contains(same.stdout, "same request") {
		t.Errorf("diff of a retry: %d %q", same.code, same.stdout)
	}
}

func TestBadConfigExitsTwoNamingTheField(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "bad.yaml", "pipelines:\n  - {name: p, input: t, output: t, dlq: d}\n")
	for _, args := range [][]string{
		{"hash", "--config", cfg, "-"},
		{"contract", "--config", cfg},
		{"run", "--config", cfg},
	} {
		r := runCLI(t, "{}", args...)
		if r.code != 2 {
			t.Errorf("%v exited %d, want 2", args, r.code)
		}
		if strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, "pipelines[0].output") {
			t.Errorf("%v stderr %q: want one line naming pipelines[0].output", args, r.stderr)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	cases := [][]string{
		{},
		{"frobnicate"},
		{"hash", "--no-such-flag"},
		{"hash", "-"},
		{"diff", "--config", exampleConfig, "only-one.json"},
		{"contract", "--config", exampleConfig, "-o", "pdf"},
		{"hash", "--config", exampleConfig, "--pipeline", "nope", "-"},
	}
	for _, args := range cases {
		r := runCLI(t, "{}", args...)
		if r.code != 2 {
			t.Errorf("%v exited %d (stderr %q), want 2", args, r.code, r.stderr)
		}
	}
	for _, n := range []string{"0", "10001"} {
		r := runCLI(t, "{}", "run", "--config", exampleConfig, "--batch-size", n)
		if r.code != 2 || !strings.Contains(r.stderr, "--batch-size "+n+": want 1 to 10000") {
			t.Errorf("run --batch-size %s exited %d (stderr %q), want 2 and a line naming --batch-size", n, r.code, r.stderr)
		}
	}
}

func TestContractCommand(t *testing.T) {
	md := runCLI(t, "", "contract", "--config", exampleConfig)
	if md.code != 0 || !strings.Contains(md.stdout, "**Window**: 10m") || !strings.Contains(md.stdout, "`/client_time`") {
		t.Errorf("contract markdown: %d %s %s", md.code, md.stdout, md.stderr)
	}
	api := runCLI(t, "", "contract", "--config", exampleConfig, "-o", "asyncapi")
	if api.code != 0 || !strings.HasPrefix(api.stdout, "asyncapi: 3.0.0\n") {
		t.Errorf("contract asyncapi: %d %q", api.code, api.stderr)
	}
}

func TestDemoRefusesImpossibleWorkload(t *testing.T) {
	r := runCLI(t, "", "demo", "--users", "10", "--commands", "5")
	if r.code != 2 {
		t.Errorf("demo with fewer commands than users: exit %d, want 2", r.code)
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		r := runCLI(t, "", arg)
		if r.code != 0 || !strings.HasPrefix(r.stdout, "idemstream ") || !strings.Contains(r.stdout, "go1.") {
			t.Errorf("%s: %d %q", arg, r.code, r.stdout)
		}
	}
}

func TestEnvironmentConfig(t *testing.T) {
	var out, errOut bytes.Buffer
	env := map[string]string{"IDEMSTREAM_CONFIG": exampleConfig, "IDEMSTREAM_KAFKA_GROUP": "ops"}
	code := run(context.Background(), []string{"contract"}, strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] })
	if code != 0 || !strings.Contains(out.String(), "`ops.coupon-claim`") {
		t.Errorf("IDEMSTREAM_* variables ignored: %d %s", code, errOut.String())
	}
}

func TestInspectRealRedis(t *testing.T) {
	addr := testenv.RedisAddr(t)
	dir := t.TempDir()
	prefix := "inspect" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg := writeFile(t, dir, "c.yaml", "store: {kind: redis, redis: {url: 'redis://"+addr+"/0', prefix: "+prefix+"}}\n"+
		"pipelines:\n  - {name: coupon-claim, input: in, output: out, dlq: dlq}\n")
	key := "9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"

	r := runCLI(t, "", "inspect", "--config", cfg, key)
	if r.code != 0 || !strings.Contains(r.stdout, "no entry for key "+key) {
		t.Fatalf("inspect of an unseen key: %d %q %q", r.code, r.stdout, r.stderr)
	}

	c, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + addr + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	store := redisstore.New(c, prefix)
	req := dedupe.DecideRequest{Namespace: "coupon-claim", Key: key, Fingerprint: "sha256:abc", RulesDigest: "sha256:r",
		Semantics: dedupe.Strict, Window: 10 * time.Minute, Lease: 30 * time.Second,
		Owner: dedupe.Owner{Holder: "host-1/in/0", Source: "in/0/7"}, Intent: dedupe.Intent{Partition: 2, Floor: 40}}
	if _, err := store.Decide(context.Background(), []dedupe.DecideRequest{req}); err != nil {
		t.Fatal(err)
	}
	r = runCLI(t, "", "inspect", "--config", cfg, "--pipeline", "coupon-claim", strings.ToUpper(key))
	if r.code != 0 {
		t.Fatalf("inspect: %d %s", r.code, r.stderr)
	}
	for _, want := range []string{"state:        PENDING", "fingerprint:  sha256:abc", "owner:        host-1/in/0@in/0/7",
		"intent:       partition 2 offset 40", "lease left:   ", "first source: in/0/7"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, r.stdout)
		}
	}
	// The store's clock may not have moved a millisecond since the
	// decision: anything in (9m, 10m] is the 10-minute window.
	_, after, _ := strings.Cut(r.stdout, "window left:  ")
	left, _, _ := strings.Cut(after, "\n")
	if d, err := time.ParseDuration(left); err != nil || d <= 9*time.Minute || d > 10*time.Minute {
		t.Errorf("inspect: window left %q, want within the 10m window:\n%s", left, r.stdout)
	}
}

// A compact entry keeps hashes where a reader brings the value: inspect
// gives back the pipeline's input topic and its current rules digest, and
// shows a finished key's holder as its digest.
func TestInspectCompactEntry(t *testing.T) {
	addr := testenv.RedisAddr(t)
	dir := t.TempDir()
	prefix := "inspectc" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg := writeFile(t, dir, "c.yaml", "store: {kind: redis, redis: {url: 'redis://"+addr+"/0', prefix: "+prefix+", entry_format: compact}}\n"+
		"pipelines:\n  - {name: coupon-claim, input: coupon.claim.commands, output: out, dlq: dlq}\n")
	loaded, err := schemas.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := loaded.Policy(loaded.Pipelines[0])
	if err != nil {
		t.Fatal(err)
	}
	canon, err := dedupe.NewCanonicalizer(pol.Rules)
	if err != nil {
		t.Fatal(err)
	}
	c, err := redisstore.NewClient(redisstore.Options{URL: "redis://" + addr + "/0"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	store := redisstore.New(c, prefix, redisstore.WithCompactEntries())
	key := "9f8a2c1d-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
	fp := "sha256:" + strings.Repeat("ab", 32)
	req := dedupe.DecideRequest{Namespace: "coupon-claim", Key: key, Fingerprint: fp, RulesDigest: canon.RulesDigest(),
		Semantics: dedupe.Strict, Window: 10 * time.Minute, Lease: 30 * time.Second,
		Owner: dedupe.Owner{Holder: "host-1/g3r1/coupon.claim.commands/0", Source: "coupon.claim.commands/0/7"}, Intent: dedupe.Intent{Partition: 2, Floor: 40}}
	if _, err := store.Decide(context.Background(), []dedupe.DecideRequest{req}); err != nil {
		t.Fatal(err)
	}
	errs, err := store.Complete(context.Background(), []dedupe.Completion{{Namespace: "coupon-claim", Key: key, Owner: req.Owner,
		State: dedupe.Success, Result: dedupe.ResultRef{Partition: 2, Offset: 41}}})
	if err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	raw, err := c.Get(context.Background(), prefix+":{coupon-claim:"+key+"}").Bytes()
	if err != nil || raw[0] >= ' ' {
		t.Fatalf("the entry is not compact: %q %v", raw, err)
	}
	r := runCLI(t, "", "inspect", "--config", cfg, key)
	if r.code != 0 {
		t.Fatalf("inspect: %d %s", r.code, r.stderr)
	}
	for _, want := range []string{"state:        SUCCESS", "fingerprint:  " + fp, "rules:        " + canon.RulesDigest(),
		"first source: coupon.claim.commands/0/7", "owner:        " + dedupe.HolderDigest(req.Owner.Holder) + "@coupon.claim.commands/0/7",
		"intent:       partition 2 offset 40", "result:       partition 2 offset 41"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, r.stdout)
		}
	}
	// The entry holds a rollback to a release before compact entries.
	if r := runCLI(t, "", "store", "formats", "--config", cfg); r.code != 0 || !strings.HasPrefix(r.stdout, "entries: 0 text, 1 compact\n") ||
		!strings.Contains(r.stdout, "do not roll back") {
		t.Errorf("store formats: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, "", "store", "formats", "--config", cfg, "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"compact": 1`) {
		t.Errorf("store formats -o json: exit %d, %s %s", r.code, r.stdout, r.stderr)
	}
}

func TestInspectStoreDown(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", "store: {redis: {url: 'redis://127.0.0.1:1/0'}}\npipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n")
	r := runCLI(t, "", "inspect", "--config", cfg, "k")
	if r.code != 1 || !strings.Contains(r.stderr, "store unavailable") {
		t.Errorf("inspect with Redis down: %d %q; want exit 1 naming the store", r.code, r.stderr)
	}
}

func TestDemoCommandJSON(t *testing.T) {
	r := runCLI(t, "", "demo", "-o", "json", "--users", "30", "--commands", "150", "--members", "2")
	if r.code != 0 {
		t.Fatalf("demo exited %d: %s", r.code, r.stderr)
	}
	var f struct {
		Commands   int            `json:"commands"`
		Injected   map[string]int `json:"injected"`
		Naive      map[string]int `json:"naive"`
		Idemstream map[string]int `json:"idemstream"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &f); err != nil {
		t.Fatalf("demo -o json output is not JSON: %v\n%s", err, r.stdout)
	}
	if f.Commands != 150 || f.Idemstream["extra_coupons"] != 0 || f.Naive["extra_coupons"] != f.Injected["volatile_only_retries"] {
		t.Errorf("demo figures: %+v", f)
	}
}

// No password reaches a log line or an error: not the Redis URL's, not the
// SASL one read from the environment.
func TestNoSecretsInLogsOrErrors(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", "kafka: {brokers: ['127.0.0.1:1'], sasl: {mechanism: scram-sha-512, username: svc, password_env: KAFKA_PW}}\n"+
		"store: {redis: {url: 'redis://svc:s3cret-redis@127.0.0.1:1/0'}}\n"+
		"pipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n")
	env := map[string]string{"KAFKA_PW": "s3cret-kafka"}
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"inspect", "--config", cfg, "k"}, strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] })
	if code == 0 {
		t.Fatalf("inspect against an unreachable Redis succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var runOut syncBuffer
	run(ctx, []string{"run", "--config", cfg, "--metrics-addr", testenv.FreeAddr(t), "--log-level", "debug"}, strings.NewReader(""), io.Discard, &runOut, func(k string) string { return env[k] })
	bad := run(context.Background(), []string{"inspect", "--config", writeFile(t, dir, "bad.yaml",
		"store: {redis: {url: 'redis://svc:s3cret-redis@127.0.0.1:notaport/0'}}\npipelines:\n  - {name: p, input: in, output: out, dlq: dlq, key: {format: any}}\n"), "k"},
		strings.NewReader(""), &out, &errOut, func(k string) string { return env[k] })
	if bad == 0 {
		t.Error("a malformed Redis URL was accepted")
	}
	all := errOut.String() + runOut.String() + out.String()
	if runOut.String() == "" {
		t.Error("run logged nothing while it could not reach Kafka or Redis")
	}
	for _, secret := range []string{"s3cret-redis", "s3cret-kafka"} {
		if strings.Contains(all, secret) {
			t.Errorf("%s leaked:\n%s", secret, all)
		}
	}
}
