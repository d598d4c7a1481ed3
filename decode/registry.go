package decode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/idemstream/idemstream/dedupe"
)

// RegistryConfig says how to reach a Confluent-compatible schema registry
// (Confluent's, Apicurio's /apis/ccompat/v7, Redpanda's, Karapace).
type RegistryConfig struct {
	URL      string
	Username string // basic auth, with Password
	Password string
	TLS      *tls.Config
	// Timeout bounds each request; 0 means 10 s.
	Timeout time.Duration
}

// Registry reads schemas. It holds no cache of its own: a Decoder keeps
// what it compiled from them.
type Registry struct {
	cl      *sr.Client
	url     string
	timeout time.Duration
}

// NewRegistry builds a client; it makes no request.
func NewRegistry(c RegistryConfig) (*Registry, error) {
	if c.URL == "" {
		return nil, errors.New("schema_registry.url is empty")
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = c.TLS
	opts := []sr.ClientOpt{sr.URLs(c.URL), sr.HTTPClient(&http.Client{Transport: tr, Timeout: timeout}), sr.UserAgent("idemstream")}
	if c.Username != "" {
		opts = append(opts, sr.BasicAuth(c.Username, c.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("schema_registry.url: %w", err)
	}
	return &Registry{cl: cl, url: c.URL, timeout: timeout}, nil
}

// Check asks the registry for its subjects: it answers, and these
// credentials may read it.
func (r *Registry) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	_, err := r.cl.Subjects(ctx)
	return r.classify(err, "list subjects", false)
}

// subjectSchema reads a subject's version (-1: the latest).
func (r *Registry) subjectSchema(ctx context.Context, subject string, version int) (sr.SubjectSchema, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	s, err := r.cl.SchemaByVersion(ctx, subject, version)
	return s, r.classify(err, fmt.Sprintf("read subject %q version %s", subject, versionText(version)), true)
}

// byID reads the schema a record's id names, with a subject and version
// that use it for the dead letters: the one under subject prefer (the
// reader's) when the id is there, else the first the registry lists.
func (r *Registry) byID(ctx context.Context, id int, prefer string) (sr.Schema, dedupe.SchemaError, error) {
	ref := dedupe.SchemaError{ID: id}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	s, err := r.cl.SchemaByID(ctx, id)
	if err != nil {
		return s, ref, r.classify(err, fmt.Sprintf("read schema id %d", id), true)
	}
	vs, err := r.cl.SchemaVersionsByID(ctx, id)
	if err != nil && !errors.Is(r.classify(err, "", true), dedupe.ErrUnknownSchema) {
		// The schema was read; without its coordinates a newer writer
		// would go unnoticed, so this is asked again too.
		return s, ref, r.classify(err, fmt.Sprintf("read the subjects of schema id %d", id), true)
	}
	for i, v := range vs {
		if i == 0 || v.Subject == prefer {
			ref.Subject, ref.Version = v.Subject, v.Version
		}
		if v.Subject == prefer {
			break
		}
	}
	return s, ref, nil
}

// sources collects the text of a schema's references, depth first, by the
// name the schema imports them under.
func (r *Registry) sources(ctx context.Context, refs []sr.SchemaReference, into map[string]string, order *[]string, depth int) error {
	if depth > 32 {
		return fmt.Errorf("%w: schema references nested deeper than 32", dedupe.ErrIncompatibleSchema)
	}
	for _, ref := range refs {
		if _, done := into[ref.Name]; done {
			continue
		}
		s, err := r.subjectSchema(ctx, ref.Subject, ref.Version)
		if err != nil {
			return err
		}
		into[ref.Name] = s.Schema.Schema
		if err := r.sources(ctx, s.References, into, order, depth+1); err != nil {
			return err
		}
		*order = append(*order, ref.Name)
	}
	return nil
}

// classify sorts the registry's answers: a schema it does not have is the
// record's (notFoundIsRecord) or the configuration's fault; a refusal
// retrying cannot cure stops the pipeline; anything else (no answer, a
// 5xx, a timeout) is the registry's and the record waits.
func (r *Registry) classify(err error, what string, notFoundIsRecord bool) error {
	if err == nil {
		return nil
	}
	var re *sr.ResponseError
	if errors.As(err, &re) {
		switch {
		case re.StatusCode == http.StatusNotFound && registryNotFound(re.ErrorCode) && notFoundIsRecord:
			return fmt.Errorf("%w: the registry has no such schema (%s: %s)", dedupe.ErrUnknownSchema, what, re.Message)
		case re.StatusCode == http.StatusNotFound && !registryNotFound(re.ErrorCode):
			// A 404 that is not the registry's own answer (a proxy, a
			// path that is not there yet) says nothing of the schema.
			return fmt.Errorf("%w: %s at %s: %d %s", dedupe.ErrRegistryUnavailable, what, r.url, re.StatusCode, re.Message)
		case re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden:
			return fmt.Errorf("schema registry %s refused to %s (%d): check schema_registry.username and password_env", r.url, what, re.StatusCode)
		case re.StatusCode >= 400 && re.StatusCode < 500 && re.StatusCode != http.StatusRequestTimeout && re.StatusCode != http.StatusTooManyRequests:
			return fmt.Errorf("schema registry %s refused to %s (%d): %s", r.url, what, re.StatusCode, re.Message)
		}
	}
	return fmt.Errorf("%w: %s at %s: %w", dedupe.ErrRegistryUnavailable, what, r.url, err)
}

// registryNotFound tells the registry's own "not found" answers (subject,
// version, schema) from any other 404.
func registryNotFound(code int) bool { return code == 40401 || code == 40402 || code == 40403 }

func versionText(v int) string {
	if v < 0 {
		return "latest"
	}
	return fmt.Sprint(v)
}
