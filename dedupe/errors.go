package dedupe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// Reason is why a record went to the dead-letter topic. The values are part
// of the product contract (the idemstream-reason header) and never change.
type Reason string

// The reasons of docs/design.md ("The records it writes").
const (
	ReasonConflict         Reason = "conflict"
	ReasonMissingKey       Reason = "missing_key"
	ReasonInvalidKey       Reason = "invalid_key"
	ReasonMalformedPayload Reason = "malformed_payload"
	ReasonPayloadTooLarge  Reason = "payload_too_large"
	ReasonInvalidSchema    Reason = "invalid_schema"
	ReasonHandlerFailed    Reason = "handler_failed"

	// The reasons of payloads behind a schema registry (Avro, Protobuf,
	// JSON Schema in the Confluent wire format).
	ReasonUnknownSchema      Reason = "unknown_schema"
	ReasonIncompatibleSchema Reason = "incompatible_schema"
	ReasonNonFiniteNumber    Reason = "non_finite_number"
)

// Reasons lists every reason in the order metrics and reports show them.
var Reasons = []Reason{ReasonConflict, ReasonMissingKey, ReasonInvalidKey, ReasonMalformedPayload,
	ReasonPayloadTooLarge, ReasonInvalidSchema, ReasonUnknownSchema, ReasonIncompatibleSchema,
	ReasonNonFiniteNumber, ReasonHandlerFailed}

// Sentinel errors. Poison errors name a bad record; ErrStoreUnavailable and
// ErrFenced describe the store's answer.
var (
	ErrMissingKey      = errors.New("missing idempotency key")
	ErrInvalidKey      = errors.New("invalid idempotency key")
	ErrPayloadTooLarge = errors.New("payload too large")
	ErrInvalidSchema   = errors.New("payload violates schema")

	// ErrUnknownSchema is a record whose schema id the registry does not
	// know; ErrIncompatibleSchema one whose writer schema cannot be read
	// as the pipeline's reader schema; ErrNonFiniteNumber a decoded
	// NaN or infinity, which no canonical form can hold.
	ErrUnknownSchema      = errors.New("unknown schema")
	ErrIncompatibleSchema = errors.New("incompatible schema")
	ErrNonFiniteNumber    = errors.New("non-finite number")

	// ErrRulesMoved is a rules check whose first copy and record were
	// read under other reader schemas however often it read them again:
	// the reader kept moving on. The check is made again.
	ErrRulesMoved = errors.New("the reader schema changed during the check")

	// ErrRegistryUnavailable wraps every failure to reach the schema
	// registry, or an answer it gave that was not about the record (a 5xx,
	// a timeout). It is never the record's fault: the record stays
	// undecided and the partition pauses.
	ErrRegistryUnavailable = errors.New("schema registry unavailable")

	// ErrStoreUnavailable wraps every failure to reach the store. The
	// caller must treat the records concerned as undecided.
	ErrStoreUnavailable = errors.New("store unavailable")

	// ErrNotReplicated is a write that the store made but that too few
	// replicas acknowledged in time: a failover could lose it, so it is
	// no decision. It wraps ErrStoreUnavailable (retryable: a retry under
	// the same owner token is safe).
	ErrNotReplicated = fmt.Errorf("%w: write not acknowledged by replicas", ErrStoreUnavailable)

	// ErrStoreForgot is a store that lost decisions it had made (a
	// FLUSHALL, a restart without persistence, a failover onto a replica
	// that never synced, a node restored empty): deciding on it would
	// decide first again keys already answered, so nothing is decided
	// until an operator accepts the loss or the window has passed. It
	// wraps ErrStoreUnavailable: the records stay undecided and the
	// partition pauses.
	ErrStoreForgot = fmt.Errorf("%w: the store forgot decisions it had made", ErrStoreUnavailable)

	// ErrEntryUnreadable is a value at a key's entry that the store does
	// not read (a later release's format, another program's value): the
	// key is not decided, and the value is never written over. Fatal: it
	// stays until an operator acts (docs/operations.md).
	ErrEntryUnreadable = errors.New("unreadable entry")

	// ErrFenced is returned for a completion whose owner token no longer
	// owns the key: another worker took the lease over. The stale owner
	// must drop its work without committing offsets.
	ErrFenced = errors.New("owner fenced: key owned by another worker")

	// ErrBrokerUnavailable wraps a Kafka request that failed for a reason
	// that may pass (no leader, a timeout, a cut connection): retry it,
	// after checking what an ambiguous write left behind.
	ErrBrokerUnavailable = errors.New("broker unavailable")

	// ErrBrokerRefused wraps a Kafka request that the cluster refused for
	// a reason retrying cannot cure (authorization, a missing topic, an
	// invalid configuration): the pipeline stops and says why.
	ErrBrokerRefused = errors.New("broker refused the request")
)

// Class is what a caller should do about an error.
type Class int

const (
	// Fatal errors stop the pipeline: retrying cannot help.
	Fatal Class = iota
	// Retryable errors leave the records undecided; pause and try again.
	Retryable
	// Poison errors condemn one record, which goes to the dead-letter topic.
	Poison
)

func (c Class) String() string {
	switch c {
	case Retryable:
		return "retryable"
	case Poison:
		return "poison"
	default:
		return "fatal"
	}
}

// Classify is the one place that decides how an error is handled.
func Classify(err error) Class {
	switch {
	case err == nil:
		return Fatal
	case ReasonOf(err) != "":
		return Poison
	case errors.Is(err, ErrBrokerRefused):
		return Fatal
	case errors.Is(err, ErrStoreUnavailable),
		errors.Is(err, ErrBrokerUnavailable),
		errors.Is(err, ErrRegistryUnavailable),
		errors.Is(err, ErrRulesMoved),
		errors.Is(err, context.DeadlineExceeded):
		return Retryable
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return Retryable
	}
	return Fatal
}

// IsRetryable reports whether err leaves records undecided and worth trying
// again.
func IsRetryable(err error) bool { return err != nil && Classify(err) == Retryable }

// ReasonOf returns the dead-letter reason of a poison error, or "" when err
// does not condemn a record.
func ReasonOf(err error) Reason {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrMissingKey):
		return ReasonMissingKey
	case errors.Is(err, ErrInvalidKey):
		return ReasonInvalidKey
	case errors.Is(err, ErrMalformedPayload):
		return ReasonMalformedPayload
	case errors.Is(err, ErrPayloadTooLarge):
		return ReasonPayloadTooLarge
	case errors.Is(err, ErrInvalidSchema):
		return ReasonInvalidSchema
	case errors.Is(err, ErrUnknownSchema):
		return ReasonUnknownSchema
	case errors.Is(err, ErrIncompatibleSchema):
		return ReasonIncompatibleSchema
	case errors.Is(err, ErrNonFiniteNumber):
		return ReasonNonFiniteNumber
	}
	return ""
}

// SchemaError is a record that could not be read under the schema its
// bytes name: the error says why, the coordinates go into the dead letter
// (idemstream-schema-id, -subject and -version). Coordinates the registry
// did not give are zero.
type SchemaError struct {
	ID      int
	Subject string
	Version int
	Err     error
}

func (e *SchemaError) Error() string {
	s := e.Err.Error() + " (schema id " + strconv.Itoa(e.ID)
	if e.Subject != "" {
		s += ", subject " + e.Subject + " version " + strconv.Itoa(e.Version)
	}
	return s + ")"
}

func (e *SchemaError) Unwrap() error { return e.Err }
