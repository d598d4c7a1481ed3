package schemas

import (
	"bytes"
	"fmt"
	"strings"
	"text/template"

	"go.yaml.in/yaml/v3"

	"github.com/idemstream/idemstream/dedupe"
)

// The contract is generated from the same Config that drives the consumer,
// so that the promise a client reads and the behaviour it gets cannot
// drift apart. The five things docs/incident.md says every API must state: key format,
// semantics, window, volatile fields, and what a client sees while a key is
// pending.

type contractPipeline struct {
	Pipeline
	ConsumerGroup string
	KeyWhere      string
	KeyFormat     string
	SemanticsName string
	SameBody      string
	OtherBody     string
	AfterWindow   string
	Pending       string
	Failed        string
	RulesDigest   string
	// SchemaRule says how an avro, protobuf or json_schema payload is read
	// and what a schema change means for a client's retries.
	SchemaRule string
}

// schemaRule is the contract's sentence on payloads read through a
// schema ("" for json and raw).
func schemaRule(p Pipeline) string {
	if !p.ReadsSchema() {
		return ""
	}
	where := fmt.Sprintf("in the schema registry's wire format (a 0 byte, the 4-byte schema id%s)", map[bool]string{true: ", the message indexes", false: ""}[p.Payload == string(dedupe.PayloadProtobuf)])
	if p.SchemaFile != "" {
		where = fmt.Sprintf("as plain %s of `%s`, without registry framing", p.Payload, p.SchemaFile)
	}
	if p.Payload == string(dedupe.PayloadJSONSchema) {
		return "Commands are JSON " + where + ", validated against the JSON Schema their id names (`invalid_schema` otherwise) and compared as JSON."
	}
	version := "its latest version when the service starts"
	if v := p.ReaderVersion(); v > 0 {
		version = fmt.Sprintf("version %d", v)
	}
	reader := fmt.Sprintf("Each is read as the reader schema, subject `%s` at %s, and compared field by field as the JSON Pointers above name them.", p.ReaderSubject(), version)
	if p.SchemaFile != "" {
		reader = "Each is compared field by field as the JSON Pointers above name them."
	}
	return fmt.Sprintf("Commands are %s %s. %s A compatible new schema version (a field added or removed with a default, fields reordered or renamed with an alias) keeps your retries replays of copies written before; a field that only a newer version than the reader schema has is not compared until the service reads that version. An id the registry does not know is rejected (`unknown_schema`), a schema that cannot be read as the reader schema too (`incompatible_schema`), and so are NaN and infinities (`non_finite_number`).", p.Payload, where, reader)
}

var semanticsText = map[string][3]string{
	"strict": {
		"strict (A): the key and the canonical body identify a request",
		"a replay: no second result",
		"a conflict: the record goes to the dead-letter topic with reason `conflict`, and the first result stands",
	},
	"lenient": {
		"lenient (B): the key alone identifies a request",
		"a replay: no second result",
		"a replay as well: no second result (counted as a lenient mismatch); the body of the first copy is the one acted on",
	},
	"window": {
		"window (C): the key identifies a request inside the window",
		"a replay: no second result",
		"a replay as well: no second result",
	},
}

func describePipeline(cfg *Config, p Pipeline) (contractPipeline, error) {
	cp := contractPipeline{Pipeline: p, ConsumerGroup: cfg.ConsumerGroup(p)}
	switch dedupe.KeySource(p.Key.From) {
	case dedupe.KeyFromHeader:
		cp.KeyWhere = fmt.Sprintf("record header `%s` (name compared case-insensitively)", p.Key.Name)
	case dedupe.KeyFromField:
		cp.KeyWhere = fmt.Sprintf("payload field `%s` (a JSON string)", p.Key.Name)
	default:
		cp.KeyWhere = "the Kafka record key"
	}
	cp.KeyFormat = keyFormatText(p.Key.Format) + fmt.Sprintf(", at most %d bytes", p.Key.MaxLength)
	t := semanticsText[p.Semantics]
	cp.SemanticsName, cp.SameBody, cp.OtherBody = t[0], t[1], t[2]
	cp.AfterWindow = fmt.Sprintf("After %s the key is forgotten: the next record with it is a new request with a new result.", p.Window)
	if p.Clock == string(dedupe.ClockEvent) {
		cp.AfterWindow += " The window runs on record timestamps (clock: event): a producer that sets timestamps controls it."
	} else {
		cp.AfterWindow += " The window runs on the store's clock from the first copy, never on record timestamps."
	}
	cp.Pending = fmt.Sprintf("Another copy that arrives while the first is still being handled waits (backing off, at most %s) for the first to finish, then is decided as above; it never produces a second result. A client that polls for the result should retry with backoff, as after an HTTP 409 with Retry-After.", p.PendingTimeout)
	cp.Failed = fmt.Sprintf("If handling fails permanently, the record goes to the dead-letter topic with reason `handler_failed` and the key is FAILED for %s. ", p.FailedTTL)
	if p.Semantics == string(dedupe.Strict) {
		cp.Failed += "Resending the same key with the same body runs it again; another body under that key is a conflict. To change your mind, generate a new key."
	} else {
		cp.Failed += "Resending the same key runs it again, whatever the body."
	}
	canon, err := dedupe.NewCanonicalizer(p.rules())
	if err != nil {
		return cp, err
	}
	cp.RulesDigest = canon.RulesDigest()
	if p.ReadsSchema() {
		// The digest names the reader schema too, which the registry
		// holds: validate --check-servers reads it and prints the digest.
		cp.RulesDigest = "set by the reader schema (idemstream validate --check-servers prints it)"
	}
	cp.SchemaRule = schemaRule(p)
	return cp, nil
}

// contractFuncs are the template functions of every contract.
var contractFuncs = template.FuncMap{
	"code": func(items []string) string {
		if len(items) == 0 {
			return "none"
		}
		out := make([]string, len(items))
		for i, s := range items {
			out[i] = "`" + s + "`"
		}
		return strings.Join(out, ", ")
	},
}

// keyFormatText says what a key of format looks like, to a client.
func keyFormatText(format string) string {
	switch {
	case format == "uuid":
		return "a UUID (RFC 9562, 8-4-4-4-12 hex digits, generated by the client, e.g. `crypto.randomUUID()`); compared case-insensitively"
	case format == "any":
		return "any non-empty UTF-8 string, compared byte for byte"
	}
	return fmt.Sprintf("a string matching `%s` in full, compared byte for byte", strings.TrimPrefix(format, "regex:"))
}

var markdownTmpl = template.Must(template.New("contract").Funcs(contractFuncs).Parse(`# Idempotency contract
{{range .}}
## {{.Name}}: ` + "`{{.Input}}`" + `

Send commands to ` + "`{{.Input}}`" + `. Each idempotency key gets exactly one result on ` + "`{{.Output}}`" + ` per window; records that cannot be accepted go to ` + "`{{.DLQ}}`" + ` with the reason in the ` + "`idemstream-reason`" + ` header.{{if .Replies}} Replays re-publish the stored result on ` + "`{{.Replies}}`" + ` with ` + "`idemstream-replayed: true`" + `.{{end}}

1. **Key**: {{.KeyWhere}}; {{.KeyFormat}}. A missing key is rejected (` + "`missing_key`" + `), a malformed one too (` + "`invalid_key`" + `). Use a new key for every new request; never reuse a business identifier such as an order number as the key.
2. **Semantics**: {{.SemanticsName}}. Same key, same body: {{.SameBody}}. Same key, another body: {{.OtherBody}}.
3. **Window**: {{.Window}}. {{.AfterWindow}}
4. **Volatile fields** (ignored when comparing bodies, safe to change on retry): {{code .Volatile}}. {{if eq .Payload "raw"}}This pipeline compares raw bytes: any byte change is another body.{{else}}Arrays compared as unordered sets: {{code .Unordered}}. Bodies are compared in RFC 8785 canonical form: member order, whitespace, number spelling (` + "`50`, `50.0`, `5e1`" + `) and string escapes never matter.{{end}}{{if .SchemaRule}} {{.SchemaRule}}{{end}}
5. **While pending**: {{.Pending}}

Failures: {{.Failed}}

| | |
|---|---|
| consumer group | ` + "`{{.ConsumerGroup}}`" + ` |
| payload | {{.Payload}}, at most {{.MaxPayloadBytes}} bytes{{if .Schema}}, validated against ` + "`{{.Schema}}`" + `{{end}} |
| client retries | the window covers retries up to {{.ClientMaxRetryInterval}} apart |
| rules digest | ` + "`{{.RulesDigest}}`" + ` |
{{end}}`))

// ContractMarkdown renders the client-facing contract of every pipeline.
func ContractMarkdown(cfg *Config) ([]byte, error) {
	pipes, err := describeAll(cfg)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := markdownTmpl.Execute(&b, pipes); err != nil {
		return nil, err
	}
	routes, err := routesMarkdown(cfg)
	if err != nil {
		return nil, err
	}
	b.Write(routes)
	return b.Bytes(), nil
}

func describeAll(cfg *Config) ([]contractPipeline, error) {
	out := make([]contractPipeline, 0, len(cfg.Pipelines))
	for _, p := range cfg.Pipelines {
		cp, err := describePipeline(cfg, p)
		if err != nil {
			return nil, err
		}
		out = append(out, cp)
	}
	return out, nil
}

// ContractAsyncAPI renders the contract as an AsyncAPI 3.0 document: one
// channel per topic, the operations idemstream performs on them, and the
// idempotency promise under x-idempotency.
func ContractAsyncAPI(cfg *Config) ([]byte, error) {
	pipes, err := describeAll(cfg)
	if err != nil {
		return nil, err
	}
	channels, operations, messages := yamlMap{}, yamlMap{}, yamlMap{}
	ref := func(path string) yamlMap { return yamlMap{"$ref": path} }
	for _, p := range pipes {
		n := p.Name
		messages[n+".command"], messages[n+".result"], messages[n+".dead-letter"] = asyncCommand(p), asyncResult(n), asyncDeadLetter(n)
		channels[n+".input"] = yamlMap{"address": p.Input, "messages": yamlMap{"command": ref("#/components/messages/" + n + ".command")}}
		channels[n+".output"] = yamlMap{"address": p.Output, "messages": yamlMap{"result": ref("#/components/messages/" + n + ".result")}}
		channels[n+".dlq"] = yamlMap{"address": p.DLQ, "messages": yamlMap{"deadLetter": ref("#/components/messages/" + n + ".dead-letter")}}
		operations[n+".receiveCommand"] = yamlMap{"action": "receive", "channel": ref("#/channels/" + n + ".input"),
			"summary": "consumed as group " + p.ConsumerGroup}
		operations[n+".sendResult"] = yamlMap{"action": "send", "channel": ref("#/channels/" + n + ".output"),
			"summary": "exactly one result per key per window"}
		operations[n+".sendDeadLetter"] = yamlMap{"action": "send", "channel": ref("#/channels/" + n + ".dlq")}
		if p.Replies != "" {
			messages[n+".reply"] = yamlMap{"name": n + ".reply", "title": "Replayed result of " + n,
				"headers": yamlMap{"type": "object", "required": []string{"idemstream-replayed"}, "properties": yamlMap{"idemstream-replayed": yamlMap{"const": "true"}}}}
			channels[n+".replies"] = yamlMap{"address": p.Replies, "messages": yamlMap{"reply": ref("#/components/messages/" + n + ".reply")}}
			operations[n+".sendReply"] = yamlMap{"action": "send", "channel": ref("#/channels/" + n + ".replies")}
		}
	}
	return orderedYAML([]string{"asyncapi", "info", "defaultContentType", "channels", "operations", "components"}, []any{
		"3.0.0",
		yamlMap{"title": "idemstream idempotency contract", "version": "1.0.0",
			"description": "Generated by `idemstream contract` from the configuration that drives the consumer."},
		"application/json", channels, operations, yamlMap{"messages": messages},
	})
}

// yamlMap is a YAML mapping of a generated document; the encoder sorts its
// keys.
type yamlMap = map[string]any

// asyncCommand is the AsyncAPI message of p's commands, its idempotency
// rules under x-idempotency.
func asyncCommand(p contractPipeline) yamlMap {
	keyHeader := yamlMap{"type": "string", "maxLength": p.Key.MaxLength}
	if p.Key.Format == "uuid" {
		keyHeader["format"] = "uuid"
	} else if strings.HasPrefix(p.Key.Format, "regex:") {
		keyHeader["pattern"] = "^(?:" + strings.TrimPrefix(p.Key.Format, "regex:") + ")$"
	}
	idem := yamlMap{
		"key":             yamlMap{"from": p.Key.From, "name": p.Key.Name, "format": p.Key.Format, "maxLength": p.Key.MaxLength},
		"semantics":       p.Semantics,
		"sameKeySameBody": p.SameBody,
		"sameKeyNewBody":  p.OtherBody,
		"window":          p.Window.String(),
		"clock":           p.Clock,
		"volatile":        nonNil(p.Volatile),
		"unordered":       nonNil(p.Unordered),
		"canonicalForm":   "RFC 8785 (JCS); payload " + p.Payload,
		"pending":         p.Pending,
		"pendingTimeout":  p.PendingTimeout.String(),
		"failedTTL":       p.FailedTTL.String(),
		"rulesDigest":     p.RulesDigest,
	}
	if p.ReadsSchema() {
		idem["readerSchema"] = readerSchemaRef(p)
	}
	command := yamlMap{
		"name":          p.Name + ".command",
		"title":         "Command of " + p.Name,
		"summary":       p.SemanticsName,
		"contentType":   contentType(p.Payload),
		"x-idempotency": idem,
	}
	if p.Key.From == string(dedupe.KeyFromHeader) {
		command["headers"] = yamlMap{"type": "object", "required": []string{p.Key.Name}, "properties": yamlMap{p.Key.Name: keyHeader}}
	}
	return command
}

// asyncResult is the AsyncAPI message of pipeline n's results.
func asyncResult(n string) yamlMap {
	return yamlMap{
		"name": n + ".result", "title": "Result of " + n,
		"headers": yamlMap{"type": "object", "required": []string{"idemstream-key", "idemstream-fingerprint", "idemstream-source", "idemstream-outcome"},
			"properties": yamlMap{
				"idemstream-key":         yamlMap{"type": "string"},
				"idemstream-fingerprint": yamlMap{"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
				"idemstream-source":      yamlMap{"type": "string", "description": "topic/partition/offset of the command"},
				"idemstream-outcome":     yamlMap{"const": "first"},
			}},
	}
}

// asyncDeadLetter is the AsyncAPI message of pipeline n's dead letters.
func asyncDeadLetter(n string) yamlMap {
	return yamlMap{
		"name": n + ".dead-letter", "title": "Dead letter of " + n,
		"headers": yamlMap{"type": "object", "required": []string{"idemstream-reason", "idemstream-error", "idemstream-source"},
			"properties": yamlMap{
				"idemstream-reason":            yamlMap{"enum": []string{"conflict", "missing_key", "invalid_key", "malformed_payload", "payload_too_large", "invalid_schema", "unknown_schema", "incompatible_schema", "non_finite_number", "handler_failed"}},
				"idemstream-error":             yamlMap{"type": "string"},
				"idemstream-source":            yamlMap{"type": "string"},
				"idemstream-fingerprint":       yamlMap{"type": "string"},
				"idemstream-first-fingerprint": yamlMap{"type": "string"},
				"idemstream-first-source":      yamlMap{"type": "string"},
				"idemstream-conflict-paths":    yamlMap{"type": "string", "description": "comma-separated JSON Pointers"},
			}},
	}
}

// orderedYAML encodes a mapping of keys to values in the order given (a
// document's top level reads in its specification's order), indented by
// two.
func orderedYAML(keys []string, values []any) ([]byte, error) {
	doc := yaml.Node{Kind: yaml.MappingNode}
	for i, k := range keys {
		var kn, vn yaml.Node
		kn.SetString(k)
		if err := vn.Encode(values[i]); err != nil {
			return nil, err
		}
		doc.Content = append(doc.Content, &kn, &vn)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	return b.Bytes(), enc.Close()
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// contentType is the AsyncAPI content type of a pipeline's commands.
func contentType(payload string) string {
	switch dedupe.PayloadFormat(payload) {
	case dedupe.PayloadRaw:
		return "application/octet-stream"
	case dedupe.PayloadAvro:
		return "application/vnd.apache.avro+binary"
	case dedupe.PayloadProtobuf:
		return "application/x-protobuf"
	}
	return "application/json"
}

// readerSchemaRef is the AsyncAPI reference to a pipeline's reader
// schema. The schema itself stays in the registry: the contract names
// where it is and how records are read against it.
func readerSchemaRef(p contractPipeline) map[string]any {
	if p.SchemaFile != "" {
		return map[string]any{"wireFormat": "plain", "file": p.SchemaFile, "rule": p.SchemaRule}
	}
	ref := map[string]any{"wireFormat": "confluent", "subject": p.ReaderSubject(), "version": "latest", "rule": p.SchemaRule}
	if v := p.ReaderVersion(); v > 0 {
		ref["version"] = v
	}
	return ref
}
