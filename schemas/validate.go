package schemas

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/idemstream/idemstream/dedupe"
)

// Defaults of the fields docs/configuration.md shows.
const (
	DefaultGroup           = "idemstream"
	DefaultCompression     = "lz4"
	DefaultAssignor        = "cooperative-sticky"
	DefaultRedisURL        = "redis://localhost:6379/0"
	DefaultRedisPrefix     = "idem"
	DefaultEntryFormat     = "text"
	DefaultMetricsAddr     = ":9464"
	DefaultKeyHeader       = "Idempotency-Key"
	DefaultKeyMaxLength    = 128
	DefaultMaxPayloadBytes = 1 << 20
	DefaultPendingTimeout  = 30 * time.Second
	DefaultReplicaTimeout  = time.Second
	// The front door's: Stripe's longest key, a wait that a client's
	// request timeout outlasts, the article's Retry-After.
	DefaultHTTPListen         = ":8080"
	DefaultUpstreamTimeout    = 30 * time.Second
	DefaultHTTPKeyMaxLength   = 255
	DefaultHTTPPendingTimeout = 10 * time.Second
	DefaultRetryAfter         = 2 * time.Second
	// DefaultClientMaxRetryInterval is the incident's longest client retry
	// interval: three tries with exponential backoff, at most 30 s.
	DefaultClientMaxRetryInterval = 30 * time.Second
)

// DefaultBrokers is where a local broker listens.
var DefaultBrokers = []string{"localhost:9092"}

func (c *Config) applyDefaults() {
	if len(c.Kafka.Brokers) == 0 {
		c.Kafka.Brokers = DefaultBrokers
	}
	if c.Kafka.Group == "" {
		c.Kafka.Group = DefaultGroup
	}
	if c.Kafka.Compression == "" {
		c.Kafka.Compression = DefaultCompression
	}
	if c.Kafka.Assignor == "" {
		c.Kafka.Assignor = DefaultAssignor
	}
	if c.Store.Kind == "" {
		c.Store.Kind = "redis"
	}
	if c.Store.Redis.URL == "" && len(c.Store.Redis.Addrs) == 0 {
		c.Store.Redis.URL = DefaultRedisURL
	}
	if c.Store.Redis.Prefix == "" {
		c.Store.Redis.Prefix = DefaultRedisPrefix
	}
	if c.Store.Redis.EntryFormat == "" {
		c.Store.Redis.EntryFormat = DefaultEntryFormat
	}
	if c.Store.Redis.CheckServer == nil {
		on := true
		c.Store.Redis.CheckServer = &on
	}
	if c.Store.Redis.ReplicaTimeout == 0 {
		c.Store.Redis.ReplicaTimeout = Duration(DefaultReplicaTimeout)
	}
	if c.Metrics.Addr == "" {
		c.Metrics.Addr = DefaultMetricsAddr
	}
	for i := range c.Pipelines {
		c.Pipelines[i].applyDefaults()
	}
	if h := c.HTTP; h != nil {
		if h.Listen == "" {
			h.Listen = DefaultHTTPListen
		}
		if h.UpstreamTimeout == 0 {
			h.UpstreamTimeout = Duration(DefaultUpstreamTimeout)
		}
		for i := range h.Routes {
			h.Routes[i].applyDefaults()
		}
	}
}

// applyDefaults fills in what the pipeline leaves out.
func (p *Pipeline) applyDefaults() {
	if p.Key.From == "" {
		p.Key.From = string(dedupe.KeyFromHeader)
	}
	if p.Key.Name == "" && p.Key.From == string(dedupe.KeyFromHeader) {
		p.Key.Name = DefaultKeyHeader
	}
	if p.Key.Format == "" {
		p.Key.Format = "uuid"
	}
	if p.Key.MaxLength == 0 {
		p.Key.MaxLength = DefaultKeyMaxLength
	}
	if p.Semantics == "" {
		p.Semantics = string(dedupe.Strict)
	}
	if p.Window == 0 {
		p.Window = Duration(dedupe.Semantics(p.Semantics).DefaultWindow())
	}
	if p.Clock == "" {
		p.Clock = string(dedupe.ClockStore)
	}
	if p.Payload == "" {
		p.Payload = string(dedupe.PayloadJSON)
	}
	if p.MaxPayloadBytes == 0 {
		p.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if p.PendingTimeout == 0 {
		p.PendingTimeout = Duration(DefaultPendingTimeout)
	}
	if p.FailedTTL == 0 {
		// The article: FAILED TTL = the window, so that a client
		// can reuse the key once the window is over.
		p.FailedTTL = p.Window
	}
	if p.ClientMaxRetryInterval == 0 {
		p.ClientMaxRetryInterval = Duration(DefaultClientMaxRetryInterval)
	}
	if p.Start == "" {
		p.Start = "earliest"
	}
}

// applyDefaults fills in what the route leaves out.
func (r *Route) applyDefaults() {
	if r.Method == "" {
		r.Method = http.MethodPost
	}
	if r.Key.From == "" {
		r.Key.From = string(dedupe.KeyFromHeader)
	}
	if r.Key.Name == "" {
		r.Key.Name = DefaultKeyHeader
	}
	if r.Key.Format == "" {
		r.Key.Format = "uuid"
	}
	if r.Key.MaxLength == 0 {
		r.Key.MaxLength = DefaultHTTPKeyMaxLength
	}
	if r.KeyRequired == nil {
		on := true
		r.KeyRequired = &on
	}
	if r.Semantics == "" {
		r.Semantics = string(dedupe.Strict)
	}
	if r.Window == 0 {
		r.Window = Duration(dedupe.Semantics(r.Semantics).DefaultWindow())
	}
	if r.StoreResponses == nil {
		r.StoreResponses = []string{"2xx"}
	}
	if r.ReplayHeaders == nil {
		r.ReplayHeaders = []string{"Content-Type", "Location"}
	}
	if r.MaxPayloadBytes == 0 {
		r.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if r.PendingTimeout == 0 {
		r.PendingTimeout = Duration(DefaultHTTPPendingTimeout)
	}
	if r.FailedTTL == 0 {
		r.FailedTTL = r.Window
	}
	if r.RetryAfter == 0 {
		r.RetryAfter = Duration(DefaultRetryAfter)
	}
	if r.ClientMaxRetryInterval == 0 {
		r.ClientMaxRetryInterval = Duration(DefaultClientMaxRetryInterval)
	}
}

// validate checks what a schema cannot: relations between fields, and
// values that need a parser (pointers, regular expressions, files).
func (c *Config) validate() error {
	if err := c.validateHTTP(); err != nil {
		return err
	}
	if c.Store.Kind == "redis" && c.Store.Redis.MasterName != "" && len(c.Store.Redis.Addrs) == 0 {
		return fieldErr("store.redis.master_name", "Sentinel needs store.redis.addrs (the sentinels)")
	}
	if c.Store.Redis.URL != "" && len(c.Store.Redis.Addrs) > 0 {
		return fieldErr("store.redis.addrs", "give either store.redis.url or store.redis.addrs, not both")
	}
	seen := pipelineNames{names: map[string]int{}, groups: map[string]int{}, outputs: map[string]int{}}
	for i, p := range c.Pipelines {
		at := func(field string) string { return fmt.Sprintf("pipelines[%d].%s", i, field) }
		if err := c.validateTopics(i, p, at, &seen); err != nil {
			return err
		}
		if err := c.validatePipeline(p, at); err != nil {
			return err
		}
	}
	return nil
}

// pipelineNames are the names, consumer groups and output topics of the
// pipelines checked so far, each with its pipeline's index.
type pipelineNames struct{ names, groups, outputs map[string]int }

// validateTopics checks that pipeline i's name, group and topics are its
// own: no two pipelines share a name, a group or an output, and no topic
// of one is read or written by it or another in another role.
func (c *Config) validateTopics(i int, p Pipeline, at func(string) string, seen *pipelineNames) error {
	if j, dup := seen.names[p.Name]; dup {
		return fieldErr(at("name"), "%q is already the name of pipelines[%d]", p.Name, j)
	}
	seen.names[p.Name] = i
	group := c.ConsumerGroup(p)
	if j, dup := seen.groups[group]; dup {
		return fieldErr(at("group"), "consumer group %q is already used by pipelines[%d]: two pipelines in one group would steal each other's partitions", group, j)
	}
	seen.groups[group] = i
	for _, t := range []struct{ field, topic string }{{"output", p.Output}, {"dlq", p.DLQ}, {"replies", p.Replies}} {
		if t.topic == p.Input {
			return fieldErr(at(t.field), "%q is also the input topic: idemstream would consume its own records", t.topic)
		}
	}
	if j, dup := seen.outputs[p.Output]; dup {
		return fieldErr(at("output"), "%q is already the output of pipelines[%d]: a recovery scan could take the other pipeline's result for its own; give each pipeline its own output topic", p.Output, j)
	}
	seen.outputs[p.Output] = i
	for j, q := range c.Pipelines {
		if j != i && (q.DLQ == p.Output || (q.Replies != "" && q.Replies == p.Output)) {
			return fieldErr(at("output"), "%q is also a dead-letter or replies topic of pipelines[%d]: a recovery scan could take those records for results; give each pipeline its own output topic", p.Output, j)
		}
	}
	if p.DLQ == p.Output {
		return fieldErr(at("dlq"), "%q is also the output topic: dead letters would pass for results", p.DLQ)
	}
	if p.Replies != "" && (p.Replies == p.Output || p.Replies == p.DLQ) {
		return fieldErr(at("replies"), "%q must differ from the output and dlq topics", p.Replies)
	}
	return nil
}

// validatePipeline checks one pipeline's key, payload, rules and times.
func (c *Config) validatePipeline(p Pipeline, at func(string) string) error {
	if (p.Key.From == string(dedupe.KeyFromHeader) || p.Key.From == string(dedupe.KeyFromField)) && p.Key.Name == "" {
		return fieldErr(at("key.name"), "required when key.from is %s", p.Key.From)
	}
	if p.Key.From == string(dedupe.KeyFromField) {
		ptr, err := dedupe.ParsePointer(p.Key.Name)
		if err != nil {
			return fieldErr(at("key.name"), "%v", err)
		}
		if slices.Contains(ptr.Tokens(), "*") {
			return fieldErr(at("key.name"), "%s: a key field must name one value, not a * wildcard", p.Key.Name)
		}
		if p.Payload == string(dedupe.PayloadRaw) {
			return fieldErr(at("key.from"), "field keys need payload: json (a raw payload has no fields)")
		}
	}
	if _, err := dedupe.ParseKeyFormat(p.Key.Format); err != nil {
		return fieldErr(at("key.format"), "%v", err)
	}
	if err := c.checkSchemaPayload(&p, at); err != nil {
		return err
	}
	if p.Payload == string(dedupe.PayloadRaw) {
		switch {
		case len(p.Volatile) > 0:
			return fieldErr(at("volatile"), "a raw payload is hashed byte for byte: volatile paths would be ignored")
		case len(p.Unordered) > 0:
			return fieldErr(at("unordered"), "a raw payload is hashed byte for byte: unordered paths would be ignored")
		case p.Schema != "":
			return fieldErr(at("schema"), "a JSON Schema needs payload: json")
		}
	}
	for field, d := range map[string]Duration{"window": p.Window, "pending_timeout": p.PendingTimeout, "failed_ttl": p.FailedTTL, "client_max_retry_interval": p.ClientMaxRetryInterval} {
		if d <= 0 {
			return fieldErr(at(field), "must be longer than zero")
		}
	}
	// The second pitfall of docs/incident.md: a window shorter than the client's
	// retry interval turns a late retry into a second charge.
	if err := checkRetryWindow(at("window"), p.Window, p.ClientMaxRetryInterval); err != nil {
		return err
	}
	if _, _, err := p.StartPosition(); err != nil {
		return fieldErr(at("start"), "%v", err)
	}
	if _, err := dedupe.NewCanonicalizer(p.rules()); err != nil {
		return fieldErr(at(pointerField(err)), "%v", err)
	}
	if p.Schema != "" {
		if _, err := compilePayloadSchema(c.Resolve(p.Schema)); err != nil {
			return fieldErr(at("schema"), "%v", err)
		}
	}
	return nil
}

func (c *Config) validateHTTP() error {
	h := c.HTTP
	if h == nil {
		return nil
	}
	if h.UpstreamTimeout <= 0 {
		return fieldErr("http.upstream_timeout", "must be longer than zero")
	}
	names := map[string]int{}
	patterns := map[string]int{}
	for i, r := range h.Routes {
		at := func(field string) string { return fmt.Sprintf("http.routes[%d].%s", i, field) }
		if j, dup := names[r.Name]; dup {
			return fieldErr(at("name"), "%q is already the name of http.routes[%d]", r.Name, j)
		}
		names[r.Name] = i
		pattern := r.Method + " " + r.Path
		if j, dup := patterns[pattern]; dup {
			return fieldErr(at("path"), "%s is already the route of http.routes[%d]", pattern, j)
		}
		patterns[pattern] = i
		if err := checkPattern(pattern); err != nil {
			return fieldErr(at("path"), "%v", err)
		}
		if _, err := dedupe.ParseKeyFormat(r.Key.Format); err != nil {
			return fieldErr(at("key.format"), "%v", err)
		}
		for field, d := range map[string]Duration{"window": r.Window, "pending_timeout": r.PendingTimeout, "failed_ttl": r.FailedTTL, "retry_after": r.RetryAfter, "client_max_retry_interval": r.ClientMaxRetryInterval} {
			if d <= 0 {
				return fieldErr(at(field), "must be longer than zero")
			}
		}
		if err := checkRetryWindow(at("window"), r.Window, r.ClientMaxRetryInterval); err != nil {
			return err
		}
		// A key whose holder stopped is taken over once its lease ends:
		// that must leave the window room to answer its retries.
		if lease := 2 * c.routeHold(r); r.Window.D() < 2*lease {
			return fieldErr(at("window"), "%s is shorter than twice the lease (2 × max(pending_timeout, http.upstream_timeout) = %s): a key taken over after a crash would leave its window at once",
				r.Window, formatDuration(lease))
		}
		if _, err := dedupe.NewCanonicalizer(routeRules(r)); err != nil {
			return fieldErr(at(pointerField(err)), "%v", err)
		}
		if slices.ContainsFunc(r.ReplayHeaders, func(x string) bool { return strings.EqualFold(x, r.Key.Name) }) {
			return fieldErr(at("replay_headers"), "%s is the route's key header, a request header: it is not an answer header to replay", r.Key.Name)
		}
	}
	return nil
}

// checkRetryWindow is the second pitfall of docs/incident.md: a window
// shorter than the client's retry interval turns a late retry into a
// second charge.
func checkRetryWindow(field string, window, retry Duration) error {
	if minWindow := retry.D() * 3 / 2; window.D() < minWindow {
		return fieldErr(field, "%s is shorter than 1.5 × client_max_retry_interval (%s) = %s: a late client retry would count as a new request",
			window, retry, formatDuration(minWindow))
	}
	return nil
}

// checkPattern reports a path net/http's ServeMux would refuse.
func checkPattern(pattern string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	http.NewServeMux().Handle(pattern, http.NotFoundHandler())
	return nil
}

// routeHold is how long a route's key may be held by one request: a
// waiter's pending_timeout or the upstream call, the longer. The lease is
// twice it.
func (c *Config) routeHold(r Route) time.Duration {
	hold := r.PendingTimeout.D()
	if c.HTTP != nil {
		hold = max(hold, c.HTTP.UpstreamTimeout.D())
	}
	return hold
}

// RoutePolicy builds the decision policy of an HTTP route: its namespace
// is http.<name>, its key the header (the front door scopes it by method,
// path and client before deciding), its payload the JSON body.
func (c *Config) RoutePolicy(r Route) (dedupe.Policy, error) {
	format, err := dedupe.ParseKeyFormat(r.Key.Format)
	if err != nil {
		return dedupe.Policy{}, err
	}
	hold := c.routeHold(r)
	return dedupe.Policy{
		Pipeline:        "http." + r.Name,
		Key:             dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: r.Key.Name, Format: format, MaxLength: r.Key.MaxLength},
		Semantics:       dedupe.Semantics(r.Semantics),
		Window:          r.Window.D(),
		Clock:           dedupe.ClockStore,
		Rules:           routeRules(r),
		MaxPayloadBytes: r.MaxPayloadBytes,
		// The lease is twice this: the key is held while the upstream
		// answers, and a waiter gives up after the route's own
		// pending_timeout (the front door waits itself).
		PendingTimeout: hold,
		FailedTTL:      r.FailedTTL.D(),
	}, nil
}

func pointerField(err error) string {
	if s := err.Error(); len(s) >= 9 && s[:9] == "unordered" {
		return "unordered"
	}
	return "volatile"
}

// Resolve makes a path of the file (schema, TLS files) relative to the
// file's directory.
func (c *Config) Resolve(path string) string {
	if path == "" || filepath.IsAbs(path) || c.Dir == "" {
		return path
	}
	return filepath.Join(c.Dir, path)
}

// rules are the pipeline's rules without its schema, for the checks of
// its paths that need no registry: a payload read through a schema gets a
// decoder that decodes nothing (Policy opens the real one).
func (p Pipeline) rules() dedupe.CanonicalRules {
	r := dedupe.CanonicalRules{
		Payload:   dedupe.PayloadFormat(p.Payload),
		Volatile:  p.Volatile,
		Unordered: p.Unordered,
	}
	if p.ReadsSchema() {
		r.Decoder = unopenedDecoder{}
	}
	return r
}

type unopenedDecoder struct{}

func (unopenedDecoder) AppendJSON(dst, _ []byte) ([]byte, error) {
	return dst, errors.New("the pipeline's schema is not read yet")
}

func (unopenedDecoder) Digest() string { return "" }

// Policy builds the decision policy of a pipeline of this config.
func (c *Config) Policy(p Pipeline) (dedupe.Policy, error) {
	format, err := dedupe.ParseKeyFormat(p.Key.Format)
	if err != nil {
		return dedupe.Policy{}, err
	}
	pol := dedupe.Policy{
		Pipeline: p.Name,
		Key: dedupe.KeySpec{
			From:      dedupe.KeySource(p.Key.From),
			Name:      p.Key.Name,
			Format:    format,
			MaxLength: p.Key.MaxLength,
		},
		Semantics:       dedupe.Semantics(p.Semantics),
		Window:          p.Window.D(),
		Clock:           dedupe.Clock(p.Clock),
		Rules:           p.rules(),
		MaxPayloadBytes: p.MaxPayloadBytes,
		PendingTimeout:  p.PendingTimeout.D(),
		FailedTTL:       p.FailedTTL.D(),
	}
	if p.ReadsSchema() {
		d, err := c.Decoder(context.Background(), p)
		if err != nil {
			return dedupe.Policy{}, err
		}
		pol.Rules.Decoder = d
	}
	if p.Schema != "" {
		v, err := compilePayloadSchema(c.Resolve(p.Schema))
		if err != nil {
			return dedupe.Policy{}, fmt.Errorf("pipeline %q: schema: %w", p.Name, err)
		}
		pol.Schema = v
	}
	return pol, nil
}

// fileExists keeps the schema error about the file, not about a URL.
func fileExists(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cannot read %s", path)
	}
	if st.IsDir() {
		return fmt.Errorf("%s is a directory", path)
	}
	return nil
}

// checkSchemaPayload checks where an avro, protobuf or json_schema
// payload's schema comes from, and that no other payload names one.
func (c *Config) checkSchemaPayload(p *Pipeline, at func(string) string) error {
	if !p.ReadsSchema() {
		switch {
		case p.ReaderSchema != nil:
			return fieldErr(at("reader_schema"), "only payload avro or protobuf has a reader schema (payload is %s)", p.Payload)
		case p.SchemaFile != "":
			return fieldErr(at("schema_file"), "only payload avro or protobuf is read through a schema file (payload is %s)", p.Payload)
		}
		return nil
	}
	if p.SchemaFile == "" {
		if c.SchemaRegistry == nil {
			return fieldErr(at("payload"), "payload %s needs schema_registry (or a schema_file for plain, unframed payloads)", p.Payload)
		}
		return nil
	}
	switch {
	case p.Payload == string(dedupe.PayloadJSONSchema):
		return fieldErr(at("schema_file"), "json_schema payloads carry a registry's schema id; for a local JSON Schema use payload: json with schema:")
	case p.ReaderSchema != nil && (p.ReaderSchema.Subject != "" || p.ReaderSchema.Version != nil):
		return fieldErr(at("reader_schema"), "a schema_file is the reader schema: reader_schema may only name its message")
	}
	if err := fileExists(c.Resolve(p.SchemaFile)); err != nil {
		return fieldErr(at("schema_file"), "%v", err)
	}
	return nil
}
