package schemas

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/idemstream/idemstream/decode"
	"github.com/idemstream/idemstream/dedupe"
)

// decoderCache keeps each pipeline's decoder once opened, so that the
// reader schema is read once per process and every tool that builds a
// policy from the same Config agrees on it.
type decoderCache struct {
	mu sync.Mutex
	m  map[string]*decode.Decoder
}

// cacheInit guards the creation of a Config's decoder cache: a Config
// built by Parse and one written as a literal both get one on first use.
var cacheInit sync.Mutex

// ReadsSchema reports whether the pipeline's payloads are read through a
// schema (avro, protobuf, json_schema).
func (p Pipeline) ReadsSchema() bool {
	switch dedupe.PayloadFormat(p.Payload) {
	case dedupe.PayloadAvro, dedupe.PayloadProtobuf, dedupe.PayloadJSONSchema:
		return true
	}
	return false
}

// ReaderSubject is the subject of the pipeline's reader schema: the one
// configured, else <input>-value as the registry's serializers name it.
func (p Pipeline) ReaderSubject() string {
	if p.ReaderSchema != nil && p.ReaderSchema.Subject != "" {
		return p.ReaderSchema.Subject
	}
	return p.Input + "-value"
}

// ReaderVersion is the configured version of the reader schema, -1 for
// the latest.
func (p Pipeline) ReaderVersion() int {
	if p.ReaderSchema == nil {
		return -1
	}
	switch v := p.ReaderSchema.Version.(type) {
	case float64:
		return int(v)
	case int:
		return v
	case string:
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return -1
}

// OpenDecoders reads the reader schema of every pipeline whose payloads
// are read through one. An error wrapping dedupe.ErrRegistryUnavailable
// may pass: `idemstream run` waits for the registry and opens again.
func (c *Config) OpenDecoders(ctx context.Context) error {
	for _, p := range c.Pipelines {
		if _, err := c.Decoder(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// Decoder returns the pipeline's decoder (nil for json and raw payloads),
// opening it the first time.
func (c *Config) Decoder(ctx context.Context, p Pipeline) (*decode.Decoder, error) {
	if !p.ReadsSchema() {
		return nil, nil
	}
	cacheInit.Lock()
	if c.decoders == nil {
		c.decoders = &decoderCache{}
	}
	cacheInit.Unlock()
	c.decoders.mu.Lock()
	defer c.decoders.mu.Unlock()
	if d, ok := c.decoders.m[p.Name]; ok {
		return d, nil
	}
	opts := decode.Options{Format: dedupe.PayloadFormat(p.Payload), Subject: p.ReaderSubject(), Version: p.ReaderVersion()}
	if p.ReaderSchema != nil {
		opts.Message = p.ReaderSchema.Message
	}
	if p.SchemaFile != "" {
		opts.SchemaFile = c.Resolve(p.SchemaFile)
	} else {
		reg, err := c.Registry()
		if err != nil {
			return nil, err
		}
		opts.Registry = reg
	}
	d, err := decode.Open(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("pipeline %q: %w", p.Name, err)
	}
	if c.decoders.m == nil {
		c.decoders.m = map[string]*decode.Decoder{}
	}
	c.decoders.m[p.Name] = d
	return d, nil
}

// Registry builds the schema registry's client from schema_registry.
func (c *Config) Registry() (*decode.Registry, error) {
	r := c.SchemaRegistry
	if r == nil {
		return nil, &FieldError{Field: "schema_registry", Msg: "required by payload avro, protobuf and json_schema without schema_file"}
	}
	rc := decode.RegistryConfig{URL: r.URL, Username: r.Username, Timeout: r.Timeout.D()}
	if r.PasswordEnv != "" {
		rc.Password = os.Getenv(r.PasswordEnv)
		if rc.Password == "" {
			return nil, &FieldError{Field: "schema_registry.password_env", Msg: "environment variable " + r.PasswordEnv + " is empty"}
		}
	}
	if t := r.TLS; t != nil {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if t.CAFile != "" {
			pem, err := os.ReadFile(c.Resolve(t.CAFile))
			if err != nil {
				return nil, &FieldError{Field: "schema_registry.tls.ca_file", Msg: err.Error()}
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, &FieldError{Field: "schema_registry.tls.ca_file", Msg: "no PEM certificate in " + t.CAFile}
			}
		}
		if t.CertFile != "" || t.KeyFile != "" {
			cert, err := tls.LoadX509KeyPair(c.Resolve(t.CertFile), c.Resolve(t.KeyFile))
			if err != nil {
				return nil, &FieldError{Field: "schema_registry.tls.cert_file", Msg: err.Error()}
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		rc.TLS = tc
	}
	return decode.NewRegistry(rc)
}
