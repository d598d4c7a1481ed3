// Package frontdoor enforces a pipeline's idempotency rules at the HTTP
// endpoint where commands arrive: a net/http middleware ([Guard.Wrap]) for
// Go services, and [Proxy] (`idemstream proxy`) in front of a service in
// any language. The rules come from the http section of the same
// configuration file (key header and format, strict, lenient or window
// semantics, volatile fields, unordered arrays, the window, failed_ttl,
// max_payload_bytes), the decisions from the same dedupe table, the state
// from the same Redis or memory store.
//
// # Using it
//
//	cfg, err := schemas.Load("idemstream.yaml")
//	store, closeStore, err := consumer.OpenStore(cfg, os.Getenv) // Redis, as the file says
//	m, err := frontdoor.NewMetrics(prometheus.DefaultRegisterer)
//	g, err := frontdoor.NewGuard(cfg, cfg.HTTP.Routes[0], store.(frontdoor.Store), frontdoor.Options{Metrics: m})
//	mux.Handle("POST /api/coupon/claim", g.Wrap(claimHandler))
//
// # What a request is answered
//
// The key is read from the route's header (a bare key, or an RFC 8941
// string as the IETF draft "The Idempotency-Key HTTP Header Field" writes
// it), and scoped by the method, the request's own path and, with
// client_header, the client: a key sent to another endpoint or by another
// client is another key. Then, following the draft and what Stripe
// documents:
//
//   - no key: 400 (or, with key_required false, passed on unguarded); a key
//     of the wrong format or length: 400; a body over max_payload_bytes: 413;
//     a body that is not JSON: 400. Nothing is stored.
//   - the first request with a key: the handler (the upstream) runs once;
//     its answer is kept and given to the client.
//   - a retry with the same body (volatile fields ignored): the kept status,
//     the replay_headers and the body, with Idempotent-Replayed: true.
//   - a retry while the first is still running waits for it up to
//     pending_timeout, then gets its answer, or 409 with Retry-After.
//   - the key with another body: 422, application/problem+json naming the
//     JSON Pointers where the body differs (strict semantics).
//   - the store does not answer: 503 with Retry-After, and the upstream is
//     not called.
//
// Every answer the front door gives itself is an RFC 9457 problem with a
// code: IDEMPOTENCY_KEY_MISSING, IDEMPOTENCY_KEY_INVALID,
// PAYLOAD_TOO_LARGE, REQUEST_BODY_INVALID, REQUEST_BODY_UNREADABLE,
// IDEMPOTENCY_PENDING,
// IDEMPOTENCY_KEY_CONFLICT, IDEMPOTENCY_STORE_UNAVAILABLE, IDEMPOTENCY_STORE_REFUSED,
// UPSTREAM_UNREACHABLE, IDEMPOTENCY_OUTCOME_UNKNOWN, ANSWER_TOO_LARGE.
//
// # Which answers are kept, and what a failure allows
//
// Answers of the classes store_responses names (2xx by default, as the
// article's code keeps only successes) complete the key SUCCESS and are
// replayed for the window. Any other answer completes it FAILED for
// failed_ttl (the window by default): a retry with the same body calls the
// upstream again, another body is a conflict under strict semantics. An
// upstream that refused the connection never saw the request: 502, FAILED.
//
// # The one rule for an unknown outcome
//
// The upstream is never called twice for one key's first request. The
// holder of a key claims the call (Store.KeepFirst) before it makes it:
// of two holders of one key (one slower than its lease and the request
// that took its key over) one claim wins, and the other waits for its
// answer. When the outcome is unknown, the key is answered 504 or 502
// with code IDEMPOTENCY_OUTCOME_UNKNOWN for the rest of its window (kept
// like an answer), and the client checks the effect before it sends a new
// key:
//
//   - the upstream did not answer within http.upstream_timeout, the
//     connection broke after the request was sent, or the guarded handler
//     panicked;
//   - the process holding the key stopped (a crash, a SIGKILL) after it
//     claimed the call: the key stays PENDING until its lease (twice the
//     longer of upstream_timeout and pending_timeout) runs out; retries
//     until then are 409, and the first retry after it takes the key over
//     and keeps the 502. If the holder had kept its answer, the retry
//     completes the key with it and replays it; if it had not claimed the
//     call (its decision's reply was lost, its client left), the retry
//     makes the call.
//
// A window must be at least twice the lease (config refuses less), so a
// key taken over still has half its window to answer its retries.
//
// # Behind it: a command stream
//
// A service behind the proxy that publishes each request as a command can
// pass the Idempotency-Key header on as the record's key header; a pipeline
// whose key is that header then decides the command once more, so a
// retried HTTP request yields one command result even when the service
// publishes twice (docs/http.md).
package frontdoor
