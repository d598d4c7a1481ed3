package main

import (
	"context"

	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/sinks"
)

const (
	claimAvroV1 = `{"type":"record","name":"Claim","namespace":"coupon.v1","fields":[
 {"name":"coupon_id","type":"long"},{"name":"user_id","type":"string"},{"name":"amount","type":"long"},
 {"name":"client_time","type":"string"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[{"name":"sku","type":"string"},{"name":"qty","type":"int"}]}}}]}`
	// v2 moves fields, adds one with a default: a compatible change a
	// producer may roll out while its clients retry.
	claimAvroV2 = `{"type":"record","name":"Claim","namespace":"coupon.v1","fields":[
 {"name":"client_time","type":"string"},{"name":"user_id","type":"string"},{"name":"coupon_id","type":"long"},
 {"name":"amount","type":"long"},{"name":"channel","type":"string","default":"app"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[{"name":"qty","type":"int"},{"name":"sku","type":"string"}]}}}]}`
	claimAvroV3 = `{"type":"record","name":"Claim","namespace":"coupon.v1","fields":[
 {"name":"client_time","type":"string"},{"name":"user_id","type":"string"},{"name":"coupon_id","type":"long"},
 {"name":"amount","type":"long"},{"name":"channel","type":"string","default":"app"},{"name":"region","type":"string","default":"eu"},
 {"name":"items","type":{"type":"array","items":{"type":"record","name":"Item","fields":[{"name":"qty","type":"int"},{"name":"sku","type":"string"}]}}}]}`
)

// schemaRun is one `idemstream run` of one pipeline whose payloads are
// read through a real registry, with the first version of its schema
// registered (id v1) before it starts.
type schemaRun struct {
	reg          *testenv.SchemaRegistry
	cl           *sr.Client
	in, out, dlq string
	inst         *instance
	io           *sinks.Kafka
	v1           int
}

// startSchemaRun starts the registry and the instance: payload avro or
// protobuf, /client_time volatile, /items unordered, keys of any format.
func startSchemaRun(t *testing.T, payload, schemaV1 string) *schemaRun {
	t.Helper()
	brokers := testenv.KafkaBrokers(t)
	redisAddr := testenv.RedisAddr(t)
	r := &schemaRun{reg: testenv.StartSchemaRegistry(t)}
	var err error
	if r.cl, err = sr.NewClient(sr.URLs(r.reg.URL)); err != nil {
		t.Fatal(err)
	}
	typ := map[string]sr.SchemaType{"avro": sr.TypeAvro, "protobuf": sr.TypeProtobuf}[payload]
	var run string
	run, r.in, r.out, r.dlq = pipelineTopics(t, brokers, payload, 1)
	r.v1 = registerSchema(t, r.cl, r.in+"-value", schemaV1, typ)
	config := writeRunConfig(t, brokers, redisAddr, run, fmt.Sprintf(
		"{name: p, input: %s, output: %s, dlq: %s, key: {format: any}, payload: %s, volatile: [/client_time], unordered: [/items]}", r.in, r.out, r.dlq, payload))
	r.inst = startInstance(t, withRegistry(t, config, r.reg.URL), nil)
	waitUntil(t, 90*time.Second, "ready", func() bool { code, _ := r.inst.get("/readyz"); return code == 200 })
	r.io = sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	return r
}

func registerSchema(t *testing.T, cl *sr.Client, subject, text string, typ sr.SchemaType) int {
	t.Helper()
	ss, err := cl.CreateSchema(context.Background(), subject, sr.Schema{Schema: text, Type: typ})
	if err != nil {
		t.Fatalf("register %s: %v", subject, err)
	}
	return ss.ID
}

// TestRunAvroThroughARealRegistry is the incident in Avro, on the real
// broker, Redis and a real schema registry (Apicurio), with records
// written by Apache Avro's Java library: retries with a new client_time
// are replays, a changed amount is a conflict naming /amount, a producer
// that moves to a compatible schema mid-stream makes no false conflict,
// garbage and unknown ids are dead letters with their reasons, and a
// registry stopped mid-stream pauses the partition (not ready, nothing
// dead-lettered) until it is back.
func TestRunAvroThroughARealRegistry(t *testing.T) {
	run := startSchemaRun(t, "avro", claimAvroV1)
	reg, cl, in, out, dlq, inst, io, v1 := run.reg, run.cl, run.in, run.out, run.dlq, run.inst, run.io, run.v1
	claim := func(coupon int, amount int, tm string, items string) string {
		return fmt.Sprintf(`{"coupon_id":%d,"user_id":"u-1024","amount":%d,"client_time":%q,"items":%s}`, coupon, amount, tm, items)
	}
	recs := testenv.JavaAvro(t, claimAvroV1, v1,
		claim(1, 50, "10:00:00", `[{"sku":"A","qty":1},{"sku":"B","qty":2}]`),
		claim(1, 50, "10:00:05", `[{"sku":"B","qty":2},{"sku":"A","qty":1}]`),
		claim(2, 50, "10:00:00", `[]`),
		claim(2, 60, "10:00:09", `[]`),
	)
	unknown := append([]byte{0, 0, 0, 0x27, 0x0f}, recs[0][5:]...) // id 9999
	produce(t, io,
		produced{in, 0, nil, key("k1"), string(recs[0])},
		produced{in, 0, nil, key("k1"), string(recs[1])},
		produced{in, 0, nil, key("k2"), string(recs[2])},
		produced{in, 0, nil, key("k2"), string(recs[3])},
		produced{in, 0, nil, key("k5"), "not avro at all"},
		produced{in, 0, nil, key("k6"), string(unknown)},
	)
	waitUntil(t, 60*time.Second, "the first six records", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "invalid") == 2 &&
			inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "conflict") == 1
	})

	// The producer moves to v2 while the client of k1 still retries.
	v2 := registerSchema(t, cl, in+"-value", claimAvroV2, sr.TypeAvro)
	v2recs := testenv.JavaAvro(t, claimAvroV2, v2,
		`{"client_time":"10:01:00","user_id":"u-1024","coupon_id":1,"amount":50,"channel":"app","items":[{"qty":1,"sku":"A"},{"qty":2,"sku":"B"}]}`,
		`{"client_time":"10:01:00","user_id":"u-2048","coupon_id":3,"amount":70,"channel":"web","items":[]}`)
	produce(t, io, produced{in, 0, nil, key("k1"), string(v2recs[0])}, produced{in, 0, nil, key("k3"), string(v2recs[1])})
	waitUntil(t, 60*time.Second, "the v2 records", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 3 &&
			inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "replay") == 2
	})

	// v3 is registered, then the registry stops before the instance has
	// read it: the record waits, the instance says why.
	v3 := registerSchema(t, cl, in+"-value", claimAvroV3, sr.TypeAvro)
	v3recs := testenv.JavaAvro(t, claimAvroV3, v3,
		`{"client_time":"10:02:00","user_id":"u-4096","coupon_id":4,"amount":80,"channel":"app","region":"us","items":[]}`)
	reg.Stop(t)
	produce(t, io, produced{in, 0, nil, key("k4"), string(v3recs[0])})
	waitUntil(t, 60*time.Second, "/readyz to name the registry", func() bool {
		code, body := inst.get("/readyz")
		return code == 503 && strings.Contains(body, "schema registry unavailable")
	})
	if n := len(readTopic(t, io, dlq)); n != 3 {
		t.Fatalf("%d dead letters while the registry was down, want the 3 from before", n)
	}
	reg.Start(t)
	waitUntil(t, 90*time.Second, "k4 decided after the registry came back", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 4
	})
	waitUntil(t, 30*time.Second, "ready again", func() bool { code, _ := inst.get("/readyz"); return code == 200 })
	checkAvroTopics(t, io, out, dlq)
}

func checkAvroTopics(t *testing.T, io *sinks.Kafka, out, dlq string) {
	t.Helper()
	results := map[string]int{}
	for _, r := range readTopic(t, io, out) {
		results[hv(r, sinks.HeaderKey)]++
	}
	for _, k := range []string{"k1", "k2", "k3", "k4"} {
		if results[k] != 1 {
			t.Errorf("key %s has %d results, want 1 (all: %v)", k, results[k], results)
		}
	}
	if len(results) != 4 {
		t.Errorf("results for %v, want k1..k4", keysOf(results))
	}
	byReason := map[string]sinks.Fetched{}
	for _, d := range readTopic(t, io, dlq) {
		byReason[hv(d, sinks.HeaderReason)] = d
	}
	if c, ok := byReason[string(dedupe.ReasonConflict)]; !ok || hv(c, sinks.HeaderConflictPaths) != "/amount" {
		t.Errorf("conflict dead letter %v, want one naming /amount", c.Headers)
	}
	if m, ok := byReason[string(dedupe.ReasonMalformedPayload)]; !ok || !strings.Contains(hv(m, sinks.HeaderError), "framing") {
		t.Errorf("malformed dead letter %v, want one that names the missing framing", m.Headers)
	}
	if u, ok := byReason[string(dedupe.ReasonUnknownSchema)]; !ok || hv(u, sinks.HeaderSchemaID) != "9999" {
		t.Errorf("unknown_schema dead letter %v, want one with idemstream-schema-id 9999", u.Headers)
	}
	if len(byReason) != 3 {
		t.Errorf("dead letters by reason %v, want conflict, malformed_payload, unknown_schema", keysOf(byReason))
	}
}

// withRegistry adds a schema_registry section to a config file.
func withRegistry(t *testing.T, config, url string) string {
	t.Helper()
	return appendToConfig(t, config, "schema_registry: {url: '"+url+"'}\n")
}

func appendToConfig(t *testing.T, config, text string) string {
	t.Helper()
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, append(b, text...), 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}

const (
	claimProtoV1 = `syntax = "proto3";
package coupon.v1;
message Claim {
  int64 coupon_id = 1;
  string user_id = 2;
  int64 amount = 3;
  string client_time = 4;
  repeated Item items = 5;
  message Item { string sku = 1; int32 qty = 2; }
}`
	// v2 adds a field: old copies read with its default.
	claimProtoV2 = `syntax = "proto3";
package coupon.v1;
message Claim {
  int64 coupon_id = 1;
  string user_id = 2;
  int64 amount = 3;
  string client_time = 4;
  repeated Item items = 5;
  string channel = 6;
  message Item { string sku = 1; int32 qty = 2; }
}`
)

// descriptorSet compiles a .proto text into the FileDescriptorSet the
// Java encoder reads.
func descriptorSet(t *testing.T, name, text string) []byte {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{name: text})})}
	files, err := c.Compile(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	set := &descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{protodesc.ToFileDescriptorProto(files[0])}}
	b, err := proto.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRunProtobufThroughARealRegistry is the incident in Protobuf, with
// records written by protobuf-java: the retries are replays, a changed
// amount a conflict naming /amount, and a retry written under the
// producer's next schema version no false conflict.
func TestRunProtobufThroughARealRegistry(t *testing.T) {
	run := startSchemaRun(t, "protobuf", claimProtoV1)
	cl, in, out, dlq, inst, io, v1 := run.cl, run.in, run.out, run.dlq, run.inst, run.io, run.v1
	set1 := descriptorSet(t, "claim.proto", claimProtoV1)
	recs := testenv.JavaProtobuf(t, set1, "coupon.v1.Claim", v1, []int{0},
		`{"couponId":"1","userId":"u-1","amount":"50","clientTime":"10:00:00","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`,
		`{"couponId":"1","userId":"u-1","amount":"50","clientTime":"10:00:07","items":[{"sku":"B","qty":2},{"sku":"A","qty":1}]}`,
		`{"couponId":"2","userId":"u-2","amount":"50","clientTime":"10:00:00"}`,
		`{"couponId":"2","userId":"u-2","amount":"60","clientTime":"10:00:09"}`)
	v2 := registerSchema(t, cl, in+"-value", claimProtoV2, sr.TypeProtobuf)
	set2 := descriptorSet(t, "claim.proto", claimProtoV2)
	upgraded := testenv.JavaProtobuf(t, set2, "coupon.v1.Claim", v2, []int{0},
		`{"couponId":"1","userId":"u-1","amount":"50","clientTime":"10:01:00","items":[{"sku":"A","qty":1},{"sku":"B","qty":2}]}`)
	produce(t, io,
		produced{in, 0, nil, key("k1"), string(recs[0])},
		produced{in, 0, nil, key("k1"), string(recs[1])},
		produced{in, 0, nil, key("k2"), string(recs[2])},
		produced{in, 0, nil, key("k2"), string(recs[3])},
		produced{in, 0, nil, key("k1"), string(upgraded[0])},
	)
	waitUntil(t, 60*time.Second, "every record decided", func() bool {
		return inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "first") == 2 &&
			inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "replay") == 2 &&
			inst.metric("idemstream_records_total", "pipeline", "p", "outcome", "conflict") == 1
	})
	if n := len(readTopic(t, io, out)); n != 2 {
		t.Errorf("%d results, want 2", n)
	}
	dl := readTopic(t, io, dlq)
	if len(dl) != 1 || hv(dl[0], sinks.HeaderReason) != "conflict" || hv(dl[0], sinks.HeaderConflictPaths) != "/amount" {
		t.Errorf("dead letters %v, want one conflict naming /amount", dl)
	}
}

// TestAuditReadsAnAvroTopic: audit finds the volatile field and the
// unordered array of an Avro topic and suggests a configuration that
// keeps the payload, the registry and the reader schema.
func TestAuditReadsAnAvroTopic(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	reg := testenv.StartSchemaRegistry(t)
	cl, err := sr.NewClient(sr.URLs(reg.URL))
	if err != nil {
		t.Fatal(err)
	}
	_, in, _, _ := pipelineTopics(t, brokers, "avro-audit", 1)
	id := registerSchema(t, cl, in+"-value", claimAvroV1, sr.TypeAvro)
	var jsonRecs []string
	var keys []string
	for k := range 20 {
		for c := range 3 {
			items := `[{"sku":"A","qty":1},{"sku":"B","qty":2}]`
			if c == 1 {
				items = `[{"sku":"B","qty":2},{"sku":"A","qty":1}]`
			}
			jsonRecs = append(jsonRecs, fmt.Sprintf(`{"coupon_id":%d,"user_id":"u","amount":50,"client_time":"t-%d-%d","items":%s}`, k, k, c, items))
			keys = append(keys, uuidN(k))
		}
	}
	recs := testenv.JavaAvro(t, claimAvroV1, id, jsonRecs...)
	io := sinks.NewKafka(&kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second})
	var msgs []produced
	for i, r := range recs {
		msgs = append(msgs, produced{in, 0, nil, key(keys[i]), string(r)})
	}
	produce(t, io, msgs...)

	dir := t.TempDir()
	config := writeFile(t, dir, "c.yaml", fmt.Sprintf("kafka: {brokers: [%s]}\nschema_registry: {url: '%s'}\npipelines:\n  - {name: p, input: %s, output: out, dlq: dlq, payload: avro}\n",
		strings.Join(brokers, ","), reg.URL, in))
	suggested := dir + "/suggested.yaml"
	r := runCLI(t, "", "audit", "--config", config, "--pipeline", "p", "--topic", in, "-o", "json", "--suggest", suggested)
	if r.code != 0 {
		t.Fatalf("audit exited %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{`"pointer": "/client_time"`, `"pointer": "/items"`, `"keys": 20`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the report lacks %s:\n%s", want, r.stdout)
		}
	}
	b, err := os.ReadFile(suggested)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"payload: avro", "schema_registry:", reg.URL, "/client_time", "/items"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the suggested file lacks %q:\n%s", want, b)
		}
	}
	if c := runCLI(t, "", "contract", "--config", suggested); c.code != 0 || !strings.Contains(c.stdout, "subject `"+in+"-value`") {
		t.Errorf("contract of the suggested file: %d %s %s", c.code, c.stdout, c.stderr)
	}
}
