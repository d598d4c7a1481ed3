// Package dedupe decides what a command record is: the first copy of a
// request, a replay of one already seen, a conflicting reuse of its
// idempotency key, or input that cannot be decided at all.
//
// It owns the three things that make "the same request" a precise notion:
//
//   - the canonical form and fingerprint of a payload ([Canonicalizer]):
//     RFC 8785 JSON with volatile fields removed and unordered arrays
//     sorted, so that a retry carrying a new client_time is still the same
//     request;
//   - the policy of a pipeline ([Policy]): where the key comes from, what a
//     valid key looks like, and which semantics (strict, lenient, window)
//     turn a fingerprint comparison into an outcome;
//   - the per-key state machine PENDING → SUCCESS | FAILED, kept in a
//     [Store] that decides atomically, with owner tokens and leases so that
//     two consumers never both act on one key.
//
// A [Decider] ties them together: it prepares records (key, fingerprint,
// validation), asks the Store for a batch of decisions, waits with backoff
// for keys that another owner holds, and returns one [Outcome] per record.
//
// The package knows nothing about Kafka: records arrive as [Record] values
// and outcomes leave as values. The consumer package moves them.
//
// # Errors
//
// Every error is classified by [Classify] into one of three classes:
// poison (the record is bad: it goes to the dead-letter topic with a
// [Reason]), retryable (the store or a dependency did not answer: decide
// nothing, pause, try again) and fatal (a programming or configuration
// error: stop). Nothing is ever decided "first" when the store did not
// answer.
package dedupe
