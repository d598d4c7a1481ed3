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
// # Step 1: say which fields do not make a request different
//
// Retries differ in fields the client sets per attempt (a timestamp, a
// retry counter, a trace id) and in what JSON does not care about (member
// order, whitespace, 50 written as 5e1). Name the first kind as JSON
// Pointers; the canonical form takes care of the second:
//
//	c, err := dedupe.NewCanonicalizer(dedupe.CanonicalRules{
//		Volatile:  []string{"/client_time", "/retry_count", "/items/*/client_ts"},
//		Unordered: []string{"/items"}, // a multiset: element order does not count
//	})
//	fp, err := c.Fingerprint(payload)  // "sha256:…", equal for every retry
//	paths, err := c.Diff(first, other) // the pointers that make two payloads differ
//
// A malformed payload (invalid JSON or UTF-8, a duplicate member, nesting
// deeper than 64) is an error whose [Reason] is malformed_payload: the
// consumer dead-letters it. `idemstream hash` and `idemstream diff` run the
// same code from the command line.
//
// # Step 2: a policy per stream of commands
//
// A [Policy] adds to the rules where the key is ([KeySpec]: a header, a
// field of the payload, or the record's key, with a format such as uuid),
// the [Semantics] and the window. Write it in code, or load it from the
// configuration file that `idemstream run` reads, which is also the
// contract published to client teams (schemas.Config.Policy):
//
//	format, _ := dedupe.ParseKeyFormat("uuid")
//	pol := dedupe.Policy{
//		Pipeline:  "coupon-claim",
//		Key:       dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: "Idempotency-Key", Format: format, MaxLength: 128},
//		Semantics: dedupe.Strict, Window: 10 * time.Minute, Clock: dedupe.ClockStore,
//		Rules:     dedupe.CanonicalRules{Volatile: []string{"/client_time"}},
//		MaxPayloadBytes: 1 << 20, PendingTimeout: 30 * time.Second, FailedTTL: 10 * time.Minute,
//	}
//
// # Step 3: a store
//
// The state of every key lives in a [Store]: redisstore for anything that
// runs in more than one process (see its example for a Store from a Redis
// URL), memstore for one process or a test. Every store passes the same
// conformance suite (storetest) and implements the decision table of
// internal/decide.Decide.
//
// # Step 4: decide
//
// Most programs never call the [Decider] themselves: consumer.NewPipeline
// builds one from the policy and the store and runs it on a Kafka topic,
// calling your handler once per key per window. The Decider is there for
// a program that reads its commands from somewhere else.
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
