package redisstore

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options describe one of the three deployment shapes: a single node (URL),
// Sentinel (Addrs of the sentinels and MasterName) or Cluster (Addrs).
type Options struct {
	URL        string
	Addrs      []string
	MasterName string
	Username   string
	// Password overrides the URL's; it comes from an environment variable
	// so that it is never written in a config file.
	Password string
	TLS      bool
	// CAFile is a PEM file of the CA to trust instead of the system's.
	CAFile string
	// Timeout bounds every call; a server that stops answering must turn
	// into an error well inside the consumer's lease.
	Timeout time.Duration
}

// DefaultTimeout is the per-call timeout when Options.Timeout is zero.
const DefaultTimeout = 2 * time.Second

// protocol is RESP2. The store reads no push notifications (no
// client-side caching, no maintenance events), and under RESP3 go-redis
// looks for them before every reply it reads: about 4% of the samples
// in a CPU profile of BenchmarkServerCPUPerRecord. A URL's protocol
// parameter still chooses.
const protocol = 2

// NewClient builds the go-redis client of the shape the options describe.
// It does not connect: the first command does.
func NewClient(o Options) (redis.UniversalClient, error) {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	var roots *x509.CertPool
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis ca_file: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis ca_file: no PEM certificate in %s", o.CAFile)
		}
	}
	if o.URL != "" {
		opt, err := redis.ParseURL(o.URL)
		if err != nil {
			// The parser quotes the URL it rejects, password and all.
			return nil, fmt.Errorf("redis url %s: %s", RedactURL(o.URL), strings.ReplaceAll(err.Error(), o.URL, RedactURL(o.URL)))
		}
		if roots != nil && opt.TLSConfig == nil {
			opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if roots != nil {
			opt.TLSConfig.RootCAs = roots
		}
		if o.Username != "" {
			opt.Username = o.Username
		}
		if o.Password != "" {
			opt.Password = o.Password
		}
		if o.TLS && opt.TLSConfig == nil {
			opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = timeout, timeout, timeout
		opt.MaxRetries = -1
		if opt.Protocol == 0 { // not set by the URL's protocol parameter
			opt.Protocol = protocol
		}
		return redis.NewClient(opt), nil
	}
	if len(o.Addrs) == 0 {
		return nil, fmt.Errorf("redis: neither a url nor addrs given")
	}
	uo := &redis.UniversalOptions{
		Addrs:        o.Addrs,
		MasterName:   o.MasterName,
		Username:     o.Username,
		Password:     o.Password,
		DialTimeout:  timeout,
		ReadTimeout:  timeout,
		WriteTimeout: timeout,
		// A retried EVALSHA after a timeout could run a decision twice
		// under another reply: the caller retries whole batches instead.
		MaxRetries: -1,
		Protocol:   protocol,
	}
	if o.TLS || roots != nil {
		uo.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	}
	return redis.NewUniversalClient(uo), nil
}

// RedactURL hides the password of a Redis URL, for logs and errors. It
// works on text, so that even a URL that does not parse is redacted.
func RedactURL(raw string) string {
	scheme := strings.Index(raw, "://")
	if scheme < 0 {
		return raw
	}
	rest := raw[scheme+3:]
	if slash := strings.IndexByte(rest, '/'); slash >= 0 {
		rest = rest[:slash]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return raw
	}
	userinfo := rest[:at]
	colon := strings.IndexByte(userinfo, ':')
	if colon < 0 {
		return raw
	}
	start := scheme + 3 + colon + 1
	return raw[:start] + "xxxxx" + raw[scheme+3+at:]
}
