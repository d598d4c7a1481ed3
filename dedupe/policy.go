package dedupe

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Semantics is what "the same request" means for a pipeline: the incident's
// table A, B and C.
type Semantics string

const (
	// Strict (A): identity is key plus fingerprint. The same key with
	// another body is a conflict. For payments and contracts.
	Strict Semantics = "strict"
	// Lenient (B): identity is the key. Another body under a seen key is a
	// replay, counted as a lenient mismatch. For claims and orders.
	Lenient Semantics = "lenient"
	// Window (C): identity is the key inside the window; after it the key
	// is new. For retry tolerance.
	Window Semantics = "window"
)

// ParseSemantics accepts strict, lenient and window.
func ParseSemantics(s string) (Semantics, error) {
	switch Semantics(s) {
	case Strict, Lenient, Window:
		return Semantics(s), nil
	}
	return "", fmt.Errorf("unknown semantics %q: want strict, lenient or window", s)
}

// DefaultWindow is the incident's window for each semantics.
func (s Semantics) DefaultWindow() time.Duration {
	if s == Window {
		return 5 * time.Minute
	}
	return 10 * time.Minute
}

// KeySource is where the idempotency key of a record is read.
type KeySource string

const (
	KeyFromHeader     KeySource = "header"
	KeyFromField      KeySource = "field"
	KeyFromMessageKey KeySource = "message_key"
)

// KeyFormat validates and normalizes idempotency keys.
type KeyFormat struct {
	spec string
	re   *regexp.Regexp
	uuid bool
}

// ParseKeyFormat accepts "uuid", "any" and "regex:<RE2>". A regex must
// match the whole key.
func ParseKeyFormat(s string) (KeyFormat, error) {
	switch {
	case s == "uuid":
		return KeyFormat{spec: s, uuid: true}, nil
	case s == "any":
		return KeyFormat{spec: s}, nil
	case strings.HasPrefix(s, "regex:"):
		expr := strings.TrimPrefix(s, "regex:")
		if expr == "" {
			return KeyFormat{}, fmt.Errorf("key format %q: empty regular expression", s)
		}
		re, err := regexp.Compile(`^(?:` + expr + `)$`)
		if err != nil {
			return KeyFormat{}, fmt.Errorf("key format %q: %w", s, err)
		}
		return KeyFormat{spec: s, re: re}, nil
	}
	return KeyFormat{}, fmt.Errorf("unknown key format %q: want uuid, any or regex:<RE2>", s)
}

func (f KeyFormat) String() string {
	if f.spec == "" {
		return "any"
	}
	return f.spec
}

// Normalize checks a key against the format and returns the form under
// which it is stored. UUIDs compare case-insensitively (RFC 9562), so they
// are stored in lowercase; every other format compares byte for byte.
func (f KeyFormat) Normalize(key string) (string, error) {
	switch {
	case f.uuid:
		if !isUUID(key) {
			return "", fmt.Errorf("%w: %q is not a UUID (8-4-4-4-12 hex digits)", ErrInvalidKey, clip(key))
		}
		return strings.ToLower(key), nil
	case f.re != nil && !f.re.MatchString(key):
		return "", fmt.Errorf("%w: %q does not match %s", ErrInvalidKey, clip(key), f.spec)
	}
	return key, nil
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// clip keeps error messages one readable line whatever a producer sent.
func clip(s string) string {
	const max = 64
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// KeySpec says where a pipeline reads keys and what they look like.
type KeySpec struct {
	From KeySource
	// Name is the header name (compared case-insensitively, as HTTP does
	// for Idempotency-Key) or the JSON Pointer of a string field.
	Name      string
	Format    KeyFormat
	MaxLength int
}

// Clock selects the clock a window runs on.
type Clock string

const (
	// ClockStore runs windows on the store's clock: a producer cannot
	// forge a timestamp to slip past a window.
	ClockStore Clock = "store"
	// ClockEvent runs windows on record timestamps, for deterministic
	// re-processing. A producer that controls timestamps controls windows.
	ClockEvent Clock = "event"
)

// SchemaValidator checks a payload against a pipeline's JSON Schema. The
// error it returns is wrapped as ErrInvalidSchema.
type SchemaValidator interface {
	ValidatePayload(payload []byte) error
}

// Policy is everything a pipeline decides records by.
type Policy struct {
	Pipeline        string
	Key             KeySpec
	Semantics       Semantics
	Window          time.Duration
	Clock           Clock
	Rules           CanonicalRules
	Schema          SchemaValidator // nil: no schema
	MaxPayloadBytes int
	// PendingTimeout bounds how long a record waits for a key that another
	// worker holds. After it, the waiter decides on the stored state.
	PendingTimeout time.Duration
	FailedTTL      time.Duration
}

// Lease is how long a worker owns a PENDING key before another may take it
// over: twice pending_timeout. A waiter gives up after pending_timeout and
// decides on the stored state, so a live owner, which also waits at most
// pending_timeout for keys of its own batch and renews its leases before
// it writes (Decider.Renew), is never taken over; only a dead one is.
func (p Policy) Lease() time.Duration { return 2 * p.PendingTimeout }
