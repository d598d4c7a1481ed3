package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemstream/idemstream/audit"
	"github.com/idemstream/idemstream/schemas"
	"github.com/idemstream/idemstream/sinks"
)

const auditSynopsis = `-b BROKERS -t TOPIC [-c FILE [--pipeline NAME] | [--key header:NAME|field:/ptr|message_key] [--key-format uuid|any|regex:RE]]
                 [--from earliest|-DURATION|RFC3339] [--max-records N] [--volatile-share 0.5]
                 [-o text|json] [--suggest FILE]`

func cmdAudit(ctx context.Context, e *env, args []string) error {
	a, err := parseAuditArgs(e, args)
	if err != nil {
		return err
	}
	cfg, pc, err := a.config(e)
	if err != nil {
		return err
	}
	pol, err := cfg.Policy(pc)
	if err != nil {
		return err
	}
	kc, err := sinks.Connect(cfg, e.getenv)
	if err != nil {
		return err
	}
	defer kc.Close()
	src := &audit.KafkaTopic{Reader: kc, Topic: a.topic, From: a.start, MaxRecords: a.maxRecords}
	if isTerminal(e.stderr) {
		src.Progress = progressLine(e.stderr)
	}
	rep, err := audit.Run(ctx, src, audit.Options{
		Policy: pol, Configured: a.configured, VolatileShare: a.share,
		ClientMaxRetryInterval: pc.ClientMaxRetryInterval.D(),
	})
	if src.Progress != nil {
		fmt.Fprint(e.stderr, "\r\033[K")
	}
	if err != nil {
		return err
	}
	suggested, err := suggestConfig(cfg, pc, a.topic, rep, !a.configured)
	if err != nil {
		return fmt.Errorf("the suggested configuration: %w", err)
	}
	if a.suggest != "" {
		if err := os.WriteFile(a.suggest, suggested, 0o644); err != nil {
			return fmt.Errorf("write --suggest: %w", err)
		}
	}
	if a.output == "json" {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(e.stdout, suggested)
}

// auditArgs are audit's flags, checked.
type auditArgs struct {
	fs              *flag.FlagSet
	cf              *configFlags
	configured      bool // a configuration file names the rules
	pipeline, topic string
	keyFlag, format string
	maxRecords      int64
	share           float64
	maxPayload      int
	output, suggest string
	start           audit.From
}

func parseAuditArgs(e *env, args []string) (*auditArgs, error) {
	a := &auditArgs{fs: newFlags(e, "audit", auditSynopsis)}
	fs := a.fs
	a.cf = addConfigFlags(fs)
	fs.StringVar(&a.pipeline, "pipeline", "", "pipeline whose key rules, rules and window apply (optional when the config has one)")
	brokers := fs.String("brokers", "", "Kafka bootstrap brokers, comma-separated (or IDEMSTREAM_BROKERS; with --config, the file's)")
	short(fs, "b", "brokers")
	fs.StringVar(&a.topic, "topic", "", "topic to read (with --config, the pipeline's input by default)")
	short(fs, "t", "topic")
	fs.StringVar(&a.keyFlag, "key", "", "where the idempotency key is: header:NAME, field:/pointer or message_key (default header:Idempotency-Key)")
	fs.StringVar(&a.format, "key-format", "", "key format: uuid, any or regex:RE (default uuid)")
	from := fs.String("from", "earliest", "where to start: earliest, -DURATION before now (-24h) or an RFC 3339 time")
	fs.Int64Var(&a.maxRecords, "max-records", 0, "stop after this many records (0: read to the end offsets seen at start)")
	fs.Float64Var(&a.share, "volatile-share", audit.DefaultVolatileShare, "share of the keys seen more than once in which a field must change to be proposed as volatile")
	fs.IntVar(&a.maxPayload, "max-payload-bytes", schemas.DefaultMaxPayloadBytes, "payloads larger than this are payload_too_large (with --config, the pipeline's)")
	outputOf := outputFlag(fs, "text", "text", "json")
	fs.StringVar(&a.suggest, "suggest", "", "write the suggested configuration to this file")
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	var err error
	if a.output, err = outputOf(); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, usagef("audit takes no arguments, got %q", fs.Args())
	}
	if a.share <= 0 || a.share > 1 {
		return nil, usagef("--volatile-share %v: want a share above 0 and at most 1", a.share)
	}
	if a.maxRecords < 0 {
		return nil, usagef("--max-records %d: want 0 (no limit) or more", a.maxRecords)
	}
	if a.start, err = audit.ParseFrom(*from, time.Now()); err != nil {
		return nil, usagef("--from %v", err)
	}
	a.configured = a.cf.path != "" || e.getenv("IDEMSTREAM_CONFIG") != ""
	if a.configured && (a.keyFlag != "" || a.format != "") {
		return nil, usagef("--key and --key-format come from the pipeline with --config: give one or the other")
	}
	if b := *brokers; b != "" {
		a.cf.overrides["kafka.brokers"] = b
	} else if b := e.getenv("IDEMSTREAM_BROKERS"); b != "" {
		a.cf.overrides["kafka.brokers"] = b
	} else if b := e.getenv("IDEMSTREAM_KAFKA_BROKERS"); b != "" {
		a.cf.overrides["kafka.brokers"] = b
	}
	return a, nil
}

// config is the configuration the audit reads under: the file's pipeline,
// or one made of the flags.
func (a *auditArgs) config(e *env) (*schemas.Config, schemas.Pipeline, error) {
	if a.configured {
		cfg, err := a.cf.load(e)
		if err != nil {
			return nil, schemas.Pipeline{}, err
		}
		pc, err := pickPipeline(cfg, a.pipeline)
		if err != nil {
			return nil, schemas.Pipeline{}, err
		}
		if a.topic == "" {
			a.topic = pc.Input
		}
		if isFlagSet(a.fs, "max-payload-bytes") {
			pc.MaxPayloadBytes = a.maxPayload
		}
		return cfg, pc, nil
	}
	switch {
	case a.pipeline != "":
		return nil, schemas.Pipeline{}, usagef("--pipeline needs --config")
	case a.topic == "":
		return nil, schemas.Pipeline{}, usagef("--topic T is required (or --config with a pipeline)")
	case a.cf.overrides["kafka.brokers"] == "":
		return nil, schemas.Pipeline{}, usagef("--brokers B is required (or IDEMSTREAM_KAFKA_BROKERS, or --config)")
	}
	return flagConfig(a.cf.overrides["kafka.brokers"], a.topic, a.keyFlag, a.format, a.maxPayload)
}

func isFlagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// flagConfig builds the pipeline that --key and --format describe, through
// the configuration loader, so that a bad key rule is refused the same way
// as in a file.
func flagConfig(brokers, topic, key, format string, maxPayload int) (*schemas.Config, schemas.Pipeline, error) {
	k := map[string]any{"from": "header", "name": schemas.DefaultKeyHeader}
	switch {
	case key == "" || key == "message_key":
		if key == "message_key" {
			k = map[string]any{"from": "message_key"}
		}
	case strings.HasPrefix(key, "header:") && len(key) > len("header:"):
		k["name"] = strings.TrimPrefix(key, "header:")
	case strings.HasPrefix(key, "field:") && len(key) > len("field:"):
		k = map[string]any{"from": "field", "name": strings.TrimPrefix(key, "field:")}
	default:
		return nil, schemas.Pipeline{}, usagef("--key %q: want header:NAME, field:/pointer or message_key", key)
	}
	if format != "" {
		k["format"] = format
	}
	doc := map[string]any{
		"kafka": map[string]any{"brokers": splitList(brokers)},
		"pipelines": []any{map[string]any{
			"name": pipelineName(topic), "input": topic, "output": topic + ".results", "dlq": topic + ".dlq",
			"key": k, "max_payload_bytes": maxPayload,
		}},
	}
	data, err := json.Marshal(doc) // JSON is YAML
	if err != nil {
		return nil, schemas.Pipeline{}, err
	}
	cfg, err := schemas.Parse(data, "")
	if err != nil {
		return nil, schemas.Pipeline{}, auditFlagError(err)
	}
	return cfg, cfg.Pipelines[0], nil
}

// auditFlagError names the flag behind a field of the built configuration.
func auditFlagError(err error) error {
	fe, ok := err.(*schemas.FieldError)
	if !ok {
		return err
	}
	flag := map[string]string{
		"pipelines[0].key.format": "--key-format", "pipelines[0].key.name": "--key", "pipelines[0].key": "--key",
		"pipelines[0].input": "--topic", "pipelines[0].name": "--topic", "kafka.brokers": "--brokers",
		"pipelines[0].max_payload_bytes": "--max-payload-bytes",
	}[fe.Field]
	if flag == "" {
		return err
	}
	return usagef("%s: %s", flag, fe.Msg)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// pipelineName makes a pipeline name of a topic name (both allow the
// same characters; a name is shorter).
func pipelineName(topic string) string {
	if len(topic) > 200 {
		topic = topic[:200]
	}
	if topic == "" {
		return "audit"
	}
	return topic
}

// Suggested configuration file: the field order of docs/configuration.md.
type yamlConfig struct {
	Kafka          yamlKafka      `yaml:"kafka"`
	SchemaRegistry *yamlRegistry  `yaml:"schema_registry,omitempty"`
	Pipelines      []yamlPipeline `yaml:"pipelines"`
}

// yamlRegistry and yamlReader carry an audited avro, protobuf or
// json_schema pipeline's schema into the suggested file.
type yamlRegistry struct {
	URL         string   `yaml:"url"`
	Username    string   `yaml:"username,omitempty"`
	PasswordEnv string   `yaml:"password_env,omitempty"`
	TLS         *yamlTLS `yaml:"tls,omitempty"`
	Timeout     string   `yaml:"timeout,omitempty"`
}

type yamlReader struct {
	Subject string `yaml:"subject,omitempty"`
	Version any    `yaml:"version,omitempty"`
	Message string `yaml:"message,omitempty"`
}

type yamlKafka struct {
	Brokers  []string  `yaml:"brokers,flow"`
	Group    string    `yaml:"group,omitempty"`
	ClientID string    `yaml:"client_id,omitempty"`
	TLS      *yamlTLS  `yaml:"tls,omitempty"`
	SASL     *yamlSASL `yaml:"sasl,omitempty"`
}

type yamlTLS struct {
	Enabled    bool   `yaml:"enabled,omitempty"`
	CAFile     string `yaml:"ca_file,omitempty"`
	CertFile   string `yaml:"cert_file,omitempty"`
	KeyFile    string `yaml:"key_file,omitempty"`
	ServerName string `yaml:"server_name,omitempty"`
}

type yamlSASL struct {
	Mechanism   string `yaml:"mechanism"`
	Username    string `yaml:"username"`
	PasswordEnv string `yaml:"password_env"`
}

type yamlKey struct {
	From      string `yaml:"from"`
	Name      string `yaml:"name,omitempty"`
	Format    string `yaml:"format"`
	MaxLength int    `yaml:"max_length"`
}

type yamlPipeline struct {
	Name                   string      `yaml:"name"`
	Group                  string      `yaml:"group,omitempty"`
	Input                  string      `yaml:"input"`
	Output                 string      `yaml:"output"`
	DLQ                    string      `yaml:"dlq"`
	Replies                string      `yaml:"replies,omitempty"`
	Key                    yamlKey     `yaml:"key"`
	Semantics              string      `yaml:"semantics"`
	Window                 string      `yaml:"window"`
	Clock                  string      `yaml:"clock"`
	Volatile               []string    `yaml:"volatile,flow"`
	Unordered              []string    `yaml:"unordered,flow"`
	Payload                string      `yaml:"payload"`
	ReaderSchema           *yamlReader `yaml:"reader_schema,omitempty"`
	SchemaFile             string      `yaml:"schema_file,omitempty"`
	Schema                 string      `yaml:"schema,omitempty"`
	MaxPayloadBytes        int         `yaml:"max_payload_bytes"`
	PendingTimeout         string      `yaml:"pending_timeout"`
	FailedTTL              string      `yaml:"failed_ttl,omitempty"`
	ClientMaxRetryInterval string      `yaml:"client_max_retry_interval"`
}

// suggestConfig writes a configuration with one pipeline: the audited one
// (or one for the topic) with the suggested window, retry interval and
// rules. It is loaded back before it is returned, so a file that
// `idemstream contract` or `run` would refuse is never written.
func suggestConfig(cfg *schemas.Config, p schemas.Pipeline, topic string, rep *audit.Report, fromFlags bool) ([]byte, error) {
	s := rep.Suggested
	yp := yamlPipeline{
		Name: p.Name, Group: p.Group, Input: topic, Output: p.Output, DLQ: p.DLQ, Replies: p.Replies,
		Key:       yamlKey{From: p.Key.From, Name: p.Key.Name, Format: p.Key.Format, MaxLength: p.Key.MaxLength},
		Semantics: s.Semantics, Window: s.Window.String(), Clock: p.Clock,
		Volatile: s.Volatile, Unordered: s.Unordered, Payload: p.Payload,
		MaxPayloadBytes: p.MaxPayloadBytes, PendingTimeout: schemas.Duration(p.PendingTimeout).String(),
		ClientMaxRetryInterval: s.ClientMaxRetryInterval.String(),
	}
	if p.Key.From == "message_key" {
		yp.Key.Name = ""
	}
	// A failed_ttl left to its default (the window) follows the new window.
	if !fromFlags && p.FailedTTL != p.Window {
		yp.FailedTTL = p.FailedTTL.String()
	}
	k := cfg.Kafka
	yc := yamlConfig{Kafka: yamlKafka{Brokers: k.Brokers, Group: k.Group, ClientID: k.ClientID}, Pipelines: []yamlPipeline{yp}}
	abs := func(path string) string {
		if path == "" {
			return ""
		}
		if a, err := filepath.Abs(cfg.Resolve(path)); err == nil {
			return a
		}
		return path
	}
	suggestSchema(cfg, p, &yc, abs)
	if t := k.TLS; t != nil {
		yc.Kafka.TLS = &yamlTLS{Enabled: t.Enabled, CAFile: abs(t.CAFile), CertFile: abs(t.CertFile), KeyFile: abs(t.KeyFile), ServerName: t.ServerName}
	}
	if sa := k.SASL; sa != nil {
		yc.Kafka.SASL = &yamlSASL{Mechanism: sa.Mechanism, Username: sa.Username, PasswordEnv: sa.PasswordEnv}
	}
	if yc.Kafka.Group == schemas.DefaultGroup {
		yc.Kafka.Group = ""
	}
	yp.Schema = abs(p.Schema)
	yc.Pipelines[0].Schema = yp.Schema
	var body bytes.Buffer
	enc := yaml.NewEncoder(&body)
	enc.SetIndent(2)
	if err := enc.Encode(yc); err != nil {
		return nil, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Suggested by `idemstream audit` of %s: %s records, %s keys, read %s.\n",
		rep.Topic, strconv.FormatInt(rep.Records, 10), strconv.FormatInt(rep.Keys, 10), time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "# Volatile: fields that changed between copies of one key in at least %.0f%% of the keys seen more than once.\n", rep.Rules.VolatileShare*100)
	for _, why := range s.Why {
		fmt.Fprintf(&b, "# %s\n", why)
	}
	if fromFlags {
		b.WriteString("# Output and dead-letter topics are placeholders: name yours.\n")
	}
	b.Write(body.Bytes())
	out := []byte(b.String())
	if _, err := schemas.Parse(out, cfg.Dir); err != nil {
		return nil, err
	}
	return out, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine rewrites one line of a terminal while the topic is read.
func progressLine(w io.Writer) func(audit.Progress) {
	started := time.Now()
	return func(p audit.Progress) {
		what := "reading"
		if p.Pass == 2 {
			what = "deciding under the suggested rules"
		}
		pct := 100.0
		if p.Total > 0 {
			pct = float64(p.Read) * 100 / float64(p.Total)
		}
		rate := float64(p.Read) / max(time.Since(started).Seconds(), 0.001)
		fmt.Fprintf(w, "\r\033[K%s: %d/%d records (%.0f%%, %.0f/s)", what, p.Read, p.Total, pct, rate)
		if p.Read == p.Total {
			started = time.Now()
		}
	}
}

// suggestSchema keeps where an audited pipeline's schema comes from: the
// registry, the reader schema or the local file.
func suggestSchema(cfg *schemas.Config, p schemas.Pipeline, yc *yamlConfig, abs func(string) string) {
	if !p.ReadsSchema() {
		return
	}
	yp := &yc.Pipelines[0]
	yp.SchemaFile = abs(p.SchemaFile)
	if r := p.ReaderSchema; r != nil {
		yp.ReaderSchema = &yamlReader{Subject: r.Subject, Version: r.Version, Message: r.Message}
	}
	if r := cfg.SchemaRegistry; r != nil && p.SchemaFile == "" {
		yc.SchemaRegistry = &yamlRegistry{URL: r.URL, Username: r.Username, PasswordEnv: r.PasswordEnv}
		if r.Timeout != 0 {
			yc.SchemaRegistry.Timeout = r.Timeout.String()
		}
		if t := r.TLS; t != nil {
			yc.SchemaRegistry.TLS = &yamlTLS{CAFile: abs(t.CAFile), CertFile: abs(t.CertFile), KeyFile: abs(t.KeyFile)}
		}
	}
}
