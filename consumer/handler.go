package consumer

import (
	"context"
	"errors"

	"github.com/idemstream/idemstream/dedupe"
)

// Command is the first copy of a request, handed to a Handler once per key
// per window.
type Command struct {
	Record      dedupe.Record
	Key         string
	Fingerprint string
}

// Result is what a Handler produces: the value of the result record and
// headers to add to the input's.
type Result struct {
	Value   []byte
	Headers []dedupe.Header
}

// Handler acts on commands. Handle is called once per key per window (and
// again after a failure, when the same request is resent). It returns:
//
//   - a Result: written to the output topic, the key becomes SUCCESS;
//   - an error wrapped by Permanent: the record goes to the dead-letter
//     topic as handler_failed and the key is FAILED until failed_ttl;
//   - any other error: retried with backoff while the partition waits.
//
// Handle must be safe for concurrent use: partitions run in parallel.
type Handler interface {
	Handle(ctx context.Context, cmd Command) (Result, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, cmd Command) (Result, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, cmd Command) (Result, error) { return f(ctx, cmd) }

// Forward is the default handler (HandlerFunc(Forward)): the result is
// the command, byte for byte, for a downstream system that acts on
// de-duplicated commands.
func Forward(_ context.Context, cmd Command) (Result, error) {
	return Result{Value: cmd.Record.Value}, nil
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks a handler error as final for this request: retrying the
// same command cannot succeed (stock exhausted, account closed).
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked by Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
