package redisstore

import (
	"crypto/tls"
	"fmt"
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
	// Timeout bounds every call; a server that stops answering must turn
	// into an error well inside the consumer's lease.
	Timeout time.Duration
}

// DefaultTimeout is the per-call timeout when Options.Timeout is zero.
const DefaultTimeout = 2 * time.Second

// NewClient builds the go-redis client of the shape the options describe.
// It does not connect: the first command does.
func NewClient(o Options) (redis.UniversalClient, error) {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if o.URL != "" {
		opt, err := redis.ParseURL(o.URL)
		if err != nil {
			// The parser quotes the URL it rejects, password and all.
			return nil, fmt.Errorf("redis url %s: %s", RedactURL(o.URL), strings.ReplaceAll(err.Error(), o.URL, RedactURL(o.URL)))
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
	}
	if o.TLS {
		uo.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
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
