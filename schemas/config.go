package schemas

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Config is a validated configuration file.
type Config struct {
	Kafka     Kafka      `json:"kafka"`
	Store     Store      `json:"store"`
	Metrics   Metrics    `json:"metrics"`
	Pipelines []Pipeline `json:"pipelines"`
	// SchemaRegistry reads the schemas of avro, protobuf and json_schema
	// payloads; nil when the file has none.
	SchemaRegistry *SchemaRegistry `json:"schema_registry,omitempty"`
	// HTTP is the front door: routes guarded by the same rules where
	// commands arrive (see package frontdoor); nil when the file has none.
	HTTP *HTTP `json:"http,omitempty"`

	// Dir is the directory of the file, against which relative paths
	// (schema files, TLS files) are resolved.
	Dir string `json:"-"`

	// decoders are the pipelines' opened schema decoders, by name (see
	// OpenDecoders).
	decoders *decoderCache
}

// SchemaRegistry is how to reach a Confluent-compatible schema registry.
type SchemaRegistry struct {
	URL         string       `json:"url"`
	Username    string       `json:"username,omitempty"`
	PasswordEnv string       `json:"password_env,omitempty"`
	TLS         *RegistryTLS `json:"tls,omitempty"`
	Timeout     Duration     `json:"timeout,omitempty"`
}

// RegistryTLS configures TLS to the schema registry.
type RegistryTLS struct {
	CAFile   string `json:"ca_file,omitempty"`
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
}

// ReaderSchema names the registry schema a pipeline's records are resolved
// to.
type ReaderSchema struct {
	Subject string `json:"subject,omitempty"`
	// Version is "latest" or a version number.
	Version any    `json:"version,omitempty"`
	Message string `json:"message,omitempty"`
}

// Kafka is how to reach the brokers.
type Kafka struct {
	Brokers  []string `json:"brokers"`
	Group    string   `json:"group"`
	ClientID string   `json:"client_id,omitempty"`
	// InstanceID makes the process a static group member, LeaveOnStop
	// makes it leave its groups when it stops in order; Assignor is
	// cooperative-sticky (the default) or range.
	InstanceID  string `json:"instance_id,omitempty"`
	LeaveOnStop bool   `json:"leave_on_stop,omitempty"`
	Assignor    string `json:"assignor,omitempty"`
	// Compression of every record idemstream writes: zstd, lz4 (the
	// default), snappy, gzip or none.
	Compression string `json:"compression,omitempty"`
	TLS         *TLS   `json:"tls,omitempty"`
	SASL        *SASL  `json:"sasl,omitempty"`
}

// TLS configures encrypted connections to the brokers.
type TLS struct {
	Enabled    bool   `json:"enabled,omitempty"`
	CAFile     string `json:"ca_file,omitempty"`
	CertFile   string `json:"cert_file,omitempty"`
	KeyFile    string `json:"key_file,omitempty"`
	ServerName string `json:"server_name,omitempty"`
}

// SASL configures broker authentication. The password is read from the
// environment variable PasswordEnv so that it never sits in the file.
type SASL struct {
	Mechanism   string `json:"mechanism"`
	Username    string `json:"username"`
	PasswordEnv string `json:"password_env"`
}

// Store selects where per-key state lives.
type Store struct {
	Kind  string `json:"kind"`
	Redis Redis  `json:"redis"`
}

// Redis configures the Redis store: a URL for one node, or Addrs for a
// cluster (or, with MasterName, Sentinel).
type Redis struct {
	URL         string   `json:"url,omitempty"`
	Addrs       []string `json:"addrs,omitempty"`
	MasterName  string   `json:"master_name,omitempty"`
	Username    string   `json:"username,omitempty"`
	PasswordEnv string   `json:"password_env,omitempty"`
	TLS         bool     `json:"tls,omitempty"`
	CAFile      string   `json:"ca_file,omitempty"`
	Prefix      string   `json:"prefix"`
	// MinReplicas is how many replicas must acknowledge every write.
	MinReplicas    int      `json:"min_replicas,omitempty"`
	ReplicaTimeout Duration `json:"replica_timeout,omitempty"`
	// CheckServer is nil when absent: on.
	CheckServer *bool `json:"check_server,omitempty"`
	// EntryFormat is text (the default) or compact.
	EntryFormat string `json:"entry_format,omitempty"`
}

// WritesCompact reports whether new entries are written compact.
func (r Redis) WritesCompact() bool { return r.EntryFormat == "compact" }

// ChecksServer reports whether the server's settings are checked at start.
func (r Redis) ChecksServer() bool { return r.CheckServer == nil || *r.CheckServer }

// Metrics configures the HTTP endpoint of /metrics, /healthz and /readyz.
type Metrics struct {
	Addr string `json:"addr"`
	// Pprof serves the Go runtime's profiles under /debug/pprof/ too.
	Pprof bool `json:"pprof,omitempty"`
}

// Pipeline is one input topic with its policy and its output topics.
type Pipeline struct {
	Name      string    `json:"name"`
	Group     string    `json:"group,omitempty"`
	Input     string    `json:"input"`
	Output    string    `json:"output"`
	DLQ       string    `json:"dlq"`
	Replies   string    `json:"replies,omitempty"`
	Key       KeyConfig `json:"key"`
	Semantics string    `json:"semantics"`
	Window    Duration  `json:"window"`
	Clock     string    `json:"clock"`
	Volatile  []string  `json:"volatile"`
	Unordered []string  `json:"unordered"`
	Payload   string    `json:"payload"`
	// ReaderSchema and SchemaFile say where an avro or protobuf
	// payload's schema is (see package decode).
	ReaderSchema           *ReaderSchema `json:"reader_schema,omitempty"`
	SchemaFile             string        `json:"schema_file,omitempty"`
	Schema                 string        `json:"schema,omitempty"`
	MaxPayloadBytes        int           `json:"max_payload_bytes"`
	PendingTimeout         Duration      `json:"pending_timeout"`
	FailedTTL              Duration      `json:"failed_ttl"`
	ClientMaxRetryInterval Duration      `json:"client_max_retry_interval"`
	// Start is where the pipeline's group begins a partition it has no
	// committed offset for: earliest (the default), latest, or an RFC 3339
	// time (see StartPosition).
	Start string `json:"start,omitempty"`
	// AcceptIdentity is the identity of the pipeline before an intended
	// rename or key rule change (see Identity): its results in the output
	// no longer stop the start.
	AcceptIdentity string `json:"accept_identity,omitempty"`
}

// Identity names what makes a pipeline's decisions its own: input, output,
// group, store namespace and key rule. Results carry it; a pipeline whose
// output holds results of another identity refuses to start (see
// consumer.Config.Identity).
func (c *Config) Identity(p Pipeline) string {
	ns := p.Name
	if c.Store.Kind == "redis" {
		ns = c.Store.Redis.Prefix + ":" + p.Name
	}
	return fmt.Sprintf("input=%s output=%s group=%s namespace=%s key=%s:%s:%s",
		p.Input, p.Output, c.ConsumerGroup(p), ns, p.Key.From, p.Key.Name, p.Key.Format)
}

// StartPosition reads Start: latest, or the time to start at (zero for
// earliest).
func (p Pipeline) StartPosition() (latest bool, at time.Time, err error) {
	switch p.Start {
	case "", "earliest":
		return false, time.Time{}, nil
	case "latest":
		return true, time.Time{}, nil
	}
	at, err = time.Parse(time.RFC3339, p.Start)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("%q: want earliest, latest or an RFC 3339 time such as 2026-12-01T00:00:00Z", p.Start)
	}
	return false, at, nil
}

// KeyConfig says where the idempotency key is read and what it looks like.
type KeyConfig struct {
	From      string `json:"from"`
	Name      string `json:"name"`
	Format    string `json:"format"`
	MaxLength int    `json:"max_length"`
}

// ConsumerGroup is the group the pipeline consumes as: its own group:
// setting, or <kafka.group>.<pipeline name>, which is where operators and
// lag monitors look for it.
func (c *Config) ConsumerGroup(p Pipeline) string {
	if p.Group != "" {
		return p.Group
	}
	return c.Kafka.Group + "." + p.Name
}

// Inputs are the pipelines' input topics: the sources of their records.
func (c *Config) Inputs() []string {
	topics := make([]string, 0, len(c.Pipelines))
	for _, p := range c.Pipelines {
		topics = append(topics, p.Input)
	}
	return topics
}

// LongestWindow is the longest window of the pipelines and routes: how
// long after its store forgot its decisions every entry the loss took
// would have ended anyway (the store's forget hold).
func (c *Config) LongestWindow() time.Duration {
	var w time.Duration
	for _, p := range c.Pipelines {
		w = max(w, p.Window.D())
	}
	if c.HTTP != nil {
		for _, r := range c.HTTP.Routes {
			w = max(w, r.Window.D())
		}
	}
	return w
}

// Pipeline returns the pipeline called name.
func (c *Config) Pipeline(name string) (Pipeline, error) {
	names := make([]string, 0, len(c.Pipelines))
	for _, p := range c.Pipelines {
		if p.Name == name {
			return p, nil
		}
		names = append(names, p.Name)
	}
	return Pipeline{}, fmt.Errorf("no pipeline %q in the config (it has: %s)", name, strings.Join(names, ", "))
}

// Duration is a time.Duration written as a Go duration string ("10m").
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return formatDuration(time.Duration(d)) }

// MarshalJSON writes the duration the way it is configured.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"10m\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (use 500ms, 30s, 10m, 1h)", s)
	}
	*d = Duration(v)
	return nil
}

// formatDuration prints 10m rather than 10m0s: it appears in contracts that
// people read.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// HTTP configures the front door: `idemstream proxy` in front of
// Upstream, or frontdoor.NewGuard in a Go service.
type HTTP struct {
	// Listen is the proxy's listen address.
	Listen string `json:"listen"`
	// Upstream is the URL of the service the proxy stands in front of.
	Upstream string `json:"upstream,omitempty"`
	// UpstreamTimeout bounds one call of the upstream; a key is held
	// (its lease) for twice the longer of it and a route's pending_timeout.
	UpstreamTimeout Duration `json:"upstream_timeout"`
	Routes          []Route  `json:"routes"`
}

// Route is one guarded endpoint: a method and a path (a net/http pattern,
// {name} wildcards allowed), with the rules of a pipeline. The fields are
// described in docs/configuration.md (http.routes[]).
type Route struct {
	// Name labels the route's metrics; http.<Name> is its store namespace.
	Name   string    `json:"name"`
	Method string    `json:"method"`
	Path   string    `json:"path"`
	Key    KeyConfig `json:"key"`
	// KeyRequired answers a request without a key 400; false passes it to
	// the upstream unguarded.
	KeyRequired *bool `json:"key_required,omitempty"`
	// ClientHeader names the header that identifies the client (an API
	// key, a tenant): part of the stored key, so that two clients' keys
	// never meet.
	ClientHeader string `json:"client_header,omitempty"`
	// Semantics, Window, Volatile, Unordered, MaxPayloadBytes, FailedTTL
	// and ClientMaxRetryInterval mean what they mean for a pipeline.
	Semantics string   `json:"semantics"`
	Window    Duration `json:"window"`
	Volatile  []string `json:"volatile"`
	// VolatileHeaders are the headers a retry may change (X-Retry-Count),
	// published in the contract; no header is ever fingerprinted.
	VolatileHeaders []string `json:"volatile_headers"`
	Unordered       []string `json:"unordered"`
	// StoreResponses are the classes of upstream answers (2xx, 3xx, 4xx,
	// 5xx) stored and replayed; any other answer fails the key: a retry
	// with the same body calls the upstream again.
	StoreResponses []string `json:"store_responses"`
	// ReplayHeaders are the upstream's answer headers stored and replayed
	// beside the status and the body (Content-Encoding always is).
	ReplayHeaders   []string `json:"replay_headers"`
	MaxPayloadBytes int      `json:"max_payload_bytes"`
	// PendingTimeout is how long a retry waits for the key's first
	// request before it is answered 409.
	PendingTimeout Duration `json:"pending_timeout"`
	FailedTTL      Duration `json:"failed_ttl"`
	// RetryAfter is the Retry-After of a 409 or 503.
	RetryAfter             Duration `json:"retry_after"`
	ClientMaxRetryInterval Duration `json:"client_max_retry_interval"`
}
