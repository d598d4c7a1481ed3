package frontdoor

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/schemas"
)

// Store keeps the front door's keys and answers: a dedupe.Store, which
// decides as it does for the stream, that also keeps one value per name
// and never replaces it (the first request's answer). memstore.Store and
// redisstore.Store are both.
type Store interface {
	dedupe.Store
	// KeepFirst keeps value under name unless a value is kept there
	// already, and returns the value kept: value itself, or the first.
	KeepFirst(ctx context.Context, namespace, name string, value []byte, ttl time.Duration) ([]byte, error)
	// Kept returns the value kept under name, and false when none is.
	Kept(ctx context.Context, namespace, name string) ([]byte, bool, error)
}

// Options are what a Guard takes besides its route.
type Options struct {
	// Metrics, from NewMetrics; nil: none.
	Metrics *Metrics
	// Logger; nil: slog.Default().
	Logger *slog.Logger
	// Instance names this process in the owner tokens of its keys, before
	// a random part of each Guard's own.
	Instance string
	// Ready, when set, is asked before every guarded request: while it
	// returns an error (the store's settings not checked yet), requests
	// are refused 503 and nothing is decided or passed on.
	Ready func() error
}

// keyHeader carries the scoped key to the decider: the route's key
// header alone would let a key reused on another path or by another
// client meet the first.
const keyHeader = "idemstream-http-key"

// maxAnswerBytes is the largest answer body kept; a larger answer is
// replaced, for the client and every retry alike, by a 502 that says so.
const maxAnswerBytes = 8 << 20

// Guard makes one route idempotent: see the package documentation for
// what each request is answered. It is safe for concurrent use and starts
// no goroutine.
type Guard struct {
	route    schemas.Route
	policy   dedupe.Policy
	format   dedupe.KeyFormat
	decider  *dedupe.Decider
	canon    *dedupe.Canonicalizer
	store    Store
	metrics  *Metrics
	log      *slog.Logger
	timeout  time.Duration
	instance string
	seq      atomic.Int64
	stored   [10]bool // by status / 100
	replay   []string // canonical header names
	ready    func() error
}

// NewGuard builds the guard of route r of cfg.HTTP over store.
func NewGuard(cfg *schemas.Config, r schemas.Route, store Store, o Options) (*Guard, error) {
	pol, err := cfg.RoutePolicy(r)
	if err != nil {
		return nil, fmt.Errorf("frontdoor: route %s: %w", r.Name, err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	// The lease covers the upstream call (cfg.RoutePolicy): the call is
	// bounded by the same http.upstream_timeout.
	timeout := schemas.DefaultUpstreamTimeout
	if cfg.HTTP != nil {
		timeout = cfg.HTTP.UpstreamTimeout.D()
	}
	// Owner tokens must never repeat, across restarts and replicas
	// given one Instance name alike.
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	instance := hex.EncodeToString(nonce[:])
	if o.Instance != "" {
		instance = o.Instance + "." + instance
	}
	g := &Guard{route: r, policy: pol, format: pol.Key.Format, store: store, metrics: o.Metrics, log: o.Logger,
		timeout: timeout, instance: instance, ready: o.Ready}
	// The decider reads the scoped key the guard builds; the key's own
	// format and length are checked before, on the header as sent.
	inner := pol
	anyFormat, _ := dedupe.ParseKeyFormat("any")
	inner.Key = dedupe.KeySpec{From: dedupe.KeyFromHeader, Name: keyHeader, Format: anyFormat, MaxLength: 1 << 16}
	inner.MaxPayloadBytes = r.MaxPayloadBytes
	if g.decider, err = dedupe.NewDecider(inner, store); err != nil {
		return nil, fmt.Errorf("frontdoor: route %s: %w", r.Name, err)
	}
	g.canon = g.decider.Canonicalizer()
	for _, class := range r.StoreResponses {
		if n, err := strconv.Atoi(strings.TrimSuffix(class, "xx")); err == nil && n >= 1 && n <= 9 {
			g.stored[n] = true
		}
	}
	for _, h := range r.ReplayHeaders {
		g.replay = append(g.replay, http.CanonicalHeaderKey(h))
	}
	return g, nil
}

// Wrap returns next guarded: the net/http middleware.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.serve(w, r, next) })
}

// Middleware is Wrap as a func(http.Handler) http.Handler, for routers
// that take middlewares in that form.
func (g *Guard) Middleware() func(http.Handler) http.Handler { return g.Wrap }

func (g *Guard) count(outcome string) {
	g.log.Debug("guarded request", "route", g.route.Name, "outcome", outcome)
	if g.metrics != nil {
		g.metrics.requests.WithLabelValues(g.route.Name, outcome).Inc()
	}
}

// request is one guarded request on its way through the guard.
type request struct {
	r    *http.Request
	body []byte
	key  string // the scoped key the store decides
	rec  dedupe.Record
	// holder names this request in the owner token; attempt, recorded as
	// the entry's intent, names the execution the request would start: a
	// takeover keeps the entry's intent (it continues that execution), a
	// FAILED key's rerun records its own (a new one).
	holder  string
	attempt int64
	// store bounds the store calls: detached from the client, so that a
	// client that hangs up never leaves a decision half made.
	store context.Context
}

func (g *Guard) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if g.ready != nil {
		if err := g.ready(); err != nil {
			g.unavailable(w, err)
			return
		}
	}
	raw := r.Header.Get(g.route.Key.Name)
	if raw == "" {
		if !*g.route.KeyRequired {
			g.count(OutcomeUnguarded)
			next.ServeHTTP(w, r)
			return
		}
		g.refuse(w, OutcomeInvalid, newProblem(http.StatusBadRequest, "IDEMPOTENCY_KEY_MISSING", "idempotency-key-missing",
			"Idempotency key missing", fmt.Sprintf("%s %s needs an %s header (%s); retries of one request must send the same key.",
				g.route.Method, g.route.Path, g.route.Key.Name, g.route.Key.Format)))
		return
	}
	key, err := g.parseKey(raw)
	if err != nil {
		g.refuse(w, OutcomeInvalid, newProblem(http.StatusBadRequest, "IDEMPOTENCY_KEY_INVALID", "idempotency-key-invalid",
			"Idempotency key invalid", fmt.Sprintf("%s: %v", g.route.Key.Name, err)))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(g.route.MaxPayloadBytes)+1))
	if err != nil {
		g.refuse(w, OutcomeInvalid, newProblem(http.StatusBadRequest, "REQUEST_BODY_UNREADABLE", "request-body-unreadable",
			"Request body unreadable", err.Error()))
		return
	}
	if len(body) > g.route.MaxPayloadBytes {
		g.refuse(w, OutcomeTooLarge, newProblem(http.StatusRequestEntityTooLarge, "PAYLOAD_TOO_LARGE", "payload-too-large",
			"Request body too large", fmt.Sprintf("the body is over %d bytes (max_payload_bytes), the most this route fingerprints", g.route.MaxPayloadBytes)))
		return
	}
	decided := body
	if len(bytes.TrimSpace(body)) == 0 {
		// A request without a body (DELETE /orders/{id}): all of them
		// are the same request under their key.
		decided = []byte("null")
	}
	seq := g.seq.Add(1)
	q := &request{r: r, body: body, key: g.scope(r, key), holder: g.instance + "/" + strconv.FormatInt(seq, 10), attempt: randomAttempt()}
	q.rec = dedupe.Record{
		Topic: "http/" + g.route.Name + "/" + g.instance, Offset: seq, Value: decided, Time: time.Now(),
		Headers: []dedupe.Header{{Key: keyHeader, Value: []byte(q.key)}},
	}
	storeCtx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), storeTimeout+2*g.route.PendingTimeout.D())
	defer cancel()
	q.store = storeCtx
	o, ok := g.decide(w, q)
	if !ok {
		return
	}
	switch o.Kind {
	case dedupe.OutcomeInvalid:
		g.refuse(w, OutcomeInvalid, newProblem(http.StatusBadRequest, "REQUEST_BODY_INVALID", "request-body-invalid",
			"Request body invalid", fmt.Sprintf("%s: %v", o.Reason, o.Err)))
	case dedupe.OutcomeConflict:
		g.conflict(w, q, &o)
	case dedupe.OutcomeReplay:
		g.replayed(w, q, &o)
	case dedupe.OutcomeFirst:
		if o.Decision.Resumed {
			g.resume(w, q, &o, next)
			return
		}
		g.call(w, q, &o, next)
	}
}

// storeTimeout bounds the store calls of one phase of a request: deciding
// and claiming (with the waits of pending_timeout on top), then keeping
// the answer and completing the key. A variable for the tests.
var storeTimeout = 10 * time.Second

// randomAttempt is a positive number no other request will draw.
func randomAttempt() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:])>>1) | 1
}

// parseKey reads the key header: an RFC 8941 string ("…", as the IETF
// draft writes it) or the bare key most clients send, checked against the
// route's format and length.
func (g *Guard) parseKey(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if strings.HasPrefix(raw, `"`) {
		s, err := parseSFString(raw)
		if err != nil {
			return "", err
		}
		raw = s
	}
	if len(raw) > g.route.Key.MaxLength {
		return "", fmt.Errorf("longer than %d bytes (max_length)", g.route.Key.MaxLength)
	}
	return g.format.Normalize(raw)
}

// parseSFString decodes an RFC 8941 sf-string: printable ASCII in quotes,
// with \" and \\ the only escapes.
func parseSFString(s string) (string, error) {
	if len(s) < 2 || s[len(s)-1] != '"' {
		return "", errors.New("a quoted key must end with a quote")
	}
	var b strings.Builder
	for i := 1; i < len(s)-1; i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s)-1 || (s[i] != '"' && s[i] != '\\') {
				return "", errors.New(`a quoted key escapes only \" and \\`)
			}
			b.WriteByte(s[i])
		case c == '"':
			return "", errors.New("a quote inside a quoted key must be escaped")
		case c < 0x20 || c > 0x7e:
			return "", errors.New("a quoted key holds printable ASCII only")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// scope is the key the store decides: method, the request's own path and
// the client (hashed: it may be a credential) before the client's key, so
// that a key sent to another endpoint or by another client is not a
// replay.
func (g *Guard) scope(r *http.Request, key string) string {
	var b strings.Builder
	b.WriteString(r.Method + " " + r.URL.Path + " ")
	if g.route.ClientHeader != "" {
		sum := sha256.Sum256([]byte(r.Header.Get(g.route.ClientHeader)))
		b.WriteString("client:" + hex.EncodeToString(sum[:8]) + " ")
	}
	b.WriteString(key)
	return b.String()
}

func (g *Guard) refuse(w http.ResponseWriter, outcome string, p *problem) {
	g.count(outcome)
	p.write(w, 0)
}

func (g *Guard) unavailable(w http.ResponseWriter, err error) {
	g.log.Warn("store unavailable: request refused before the upstream was called", "route", g.route.Name, "err", err)
	g.count(OutcomeStoreUnavailable)
	newProblem(http.StatusServiceUnavailable, "IDEMPOTENCY_STORE_UNAVAILABLE", "store-unavailable", "Idempotency store unavailable",
		"the request was not passed on; retry it with the same key").write(w, g.route.RetryAfter.D())
}

// storeRefused answers a decision the store refused for good (a value at
// the key's entry it does not read, a command its ACL refuses): a retry
// gets the same answer until an operator acts, so no Retry-After.
func (g *Guard) storeRefused(w http.ResponseWriter, err error) {
	g.log.Error("store refused the decision: request refused before the upstream was called", "route", g.route.Name, "err", err)
	g.count(OutcomeStoreRefused)
	newProblem(http.StatusInternalServerError, "IDEMPOTENCY_STORE_REFUSED", "store-refused", "Idempotency store refused the key",
		"the request was not passed on; the store cannot decide this key until an operator acts").write(w, 0)
}

// decide asks the store, and while another request holds the key waits
// for it up to pending_timeout (polling with backoff); still held, the
// client is answered 409 with Retry-After, as the article asks.
func (g *Guard) decide(w http.ResponseWriter, q *request) (dedupe.Outcome, bool) {
	ctx := q.r.Context()
	deadline := time.Now().Add(g.route.PendingTimeout.D())
	pause := 5 * time.Millisecond
	for {
		outs, deferred, err := g.decider.DecideAvailable(q.store, q.holder, []dedupe.Record{q.rec}, q.intent)
		if err != nil {
			// The decision may have been made and its answer lost: release
			// the key if this request holds it (a completion takes only
			// its own token), so that a retry need not wait out a lease.
			_, _ = g.store.Complete(q.store, []dedupe.Completion{{Namespace: g.policy.Pipeline, Key: q.key,
				Owner: dedupe.Owner{Holder: q.holder, Source: q.rec.Source()}, State: dedupe.Pending}})
			if dedupe.IsRetryable(err) {
				g.unavailable(w, err)
			} else {
				g.storeRefused(w, err)
			}
			return dedupe.Outcome{}, false
		}
		o := outs[0]
		if len(deferred) == 0 && g.decider.NeedsRulesCheck(&o) {
			// The rules changed since the key's first request: compare
			// its body under the current rules before calling it a
			// conflict or acting on the key.
			if outs, deferred, err = g.rulesChecked(q, &o); err != nil {
				g.unavailable(w, err)
				return dedupe.Outcome{}, false
			}
			o = outs[0]
		}
		if len(deferred) == 0 {
			return o, true
		}
		if !time.Now().Add(pause).Before(deadline) {
			g.count(OutcomeInProgress)
			newProblem(http.StatusConflict, "IDEMPOTENCY_PENDING", "idempotency-pending", "Request in progress",
				"a request with this idempotency key is still being processed; retry after Retry-After with the same key and body").
				write(w, g.route.RetryAfter.D())
			return dedupe.Outcome{}, false
		}
		select {
		case <-ctx.Done():
			return dedupe.Outcome{}, false // the client left: nothing was done for it
		case <-time.After(pause):
		}
		pause = min(pause*2, 200*time.Millisecond)
	}
}

// rulesChecked settles a fingerprint mismatch against an entry made under
// other rules: the first request's body, read back from its kept answer
// or its claim, is fingerprinted under the current ones; a first request
// gone from the store is no evidence of a conflict.
func (g *Guard) rulesChecked(q *request, o *dedupe.Outcome) ([]dedupe.Outcome, []int, error) {
	first, found, err := g.firstBody(q, &o.Decision.Entry)
	if err != nil {
		return nil, nil, err
	}
	same, err := g.decider.SameRequestUnderCurrentRules(o, q.rec.Value, first, found)
	if err != nil {
		return nil, nil, err
	}
	if !same {
		o.Kind = dedupe.OutcomeConflict
		return []dedupe.Outcome{*o}, nil, nil
	}
	return g.decider.DecideRulesChecked(q.store, q.holder, []dedupe.Record{q.rec}, q.intent, false)
}

// intent records the request's attempt; an answer has no output
// partition.
func (q *request) intent(*dedupe.Record, string) dedupe.Intent {
	return dedupe.Intent{Partition: 0, Floor: q.attempt}
}

// answerName names the answer of the execution e records: its decision
// and its attempt. Every holder of that execution (the one that started
// it, one that took it over) keeps and finds its answer there; a FAILED
// key's rerun is another execution with a name of its own.
func answerName(key string, e *dedupe.Entry) string {
	return key + "\x00" + e.DecisionID() + "\x00" + strconv.FormatInt(e.Intent.Floor, 10)
}

// claimName names the claim of an execution's one upstream call.
func claimName(key string, e *dedupe.Entry) string { return answerName(key, e) + "\x00call" }

func (g *Guard) kept(q *request, e *dedupe.Entry) (answer, bool, error) {
	b, found, err := g.store.Kept(q.store, g.policy.Pipeline, answerName(q.key, e))
	if err != nil || !found {
		return answer{}, false, err
	}
	a, err := decodeAnswer(b)
	if err != nil {
		return answer{}, false, err
	}
	return a, true, nil
}

// claim is what the holder about to call the upstream keeps first: its
// name and the request body (so that a conflict or a rules check can be
// explained before any answer is kept).
type claim struct {
	Holder  string `json:"holder"`
	Request []byte `json:"request"`
}

func (g *Guard) claimOf(q *request, e *dedupe.Entry) (claim, bool, error) {
	b, found, err := g.store.Kept(q.store, g.policy.Pipeline, claimName(q.key, e))
	if err != nil || !found {
		return claim{}, false, err
	}
	var c claim
	if err := json.Unmarshal(b, &c); err != nil {
		return claim{}, false, fmt.Errorf("stored claim: %w", err)
	}
	return c, true, nil
}

// firstBody is the body of the request that started e's execution: from
// its kept answer, or its claim.
func (g *Guard) firstBody(q *request, e *dedupe.Entry) ([]byte, bool, error) {
	if a, found, err := g.kept(q, e); err != nil || (found && a.Request != nil) {
		return a.Request, found, err
	}
	c, found, err := g.claimOf(q, e)
	return c.Request, found, err
}

// keptTTL outlasts the entry that points to an answer: its window, or
// failed_ttl, counted from the completion that follows it, and the lease
// of a holder that completes late. Keeping an answer again extends it.
func (g *Guard) keptTTL() time.Duration {
	return max(g.policy.Window, g.policy.FailedTTL) + g.policy.Lease() + time.Minute
}

// release ends the lease of a key this request holds and has not called
// the upstream for, so that the next retry takes it over at once.
func (g *Guard) release(q *request, o *dedupe.Outcome) {
	_, _ = g.store.Complete(q.store, []dedupe.Completion{{Namespace: g.policy.Pipeline, Key: o.Key, Owner: o.Decision.Entry.Owner, State: dedupe.Pending}})
}

// call runs the key's one upstream call: it claims the call first (a
// holder slower than its lease and the request that took its key over
// may both get here; one claim wins, and the other waits for its
// answer), calls the upstream, keeps the answer, completes the key and
// answers the client. The call runs on a context of its own: a client
// that hangs up does not stop the one execution its retries will be
// given.
func (g *Guard) call(w http.ResponseWriter, q *request, o *dedupe.Outcome, next http.Handler) {
	mine, err := json.Marshal(claim{Holder: q.holder, Request: q.body})
	if err != nil {
		panic(err)
	}
	won, err := g.store.KeepFirst(q.store, g.policy.Pipeline, claimName(q.key, &o.Decision.Entry), mine, g.keptTTL())
	if err != nil {
		// The claim is unique to this request: asking again tells whether
		// the first write landed.
		won, err = g.store.KeepFirst(q.store, g.policy.Pipeline, claimName(q.key, &o.Decision.Entry), mine, g.keptTTL())
	}
	if err != nil {
		g.release(q, o)
		g.unavailable(w, err)
		return
	}
	if !bytes.Equal(won, mine) {
		g.await(w, q, o)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(q.r.Context()), g.timeout)
	defer cancel()
	failure := &upstreamFailure{}
	ctx = context.WithValue(ctx, failureKey{}, failure)
	up := q.r.Clone(ctx)
	up.Body = io.NopCloser(bytes.NewReader(q.body))
	up.ContentLength = int64(len(q.body))
	// No GetBody: with it and an Idempotency-Key header, net/http's
	// client takes the request for one it may send again on its own when
	// a kept-alive connection breaks, a second call the guard never saw.
	up.GetBody = nil
	up.Header.Del("Expect") // the body is read already: nothing to continue
	// The answer is kept and replayed decoded: an encoding negotiated
	// with the first client would reach clients that never asked for it.
	up.Header.Del("Accept-Encoding")
	rec := newRecorder(maxAnswerBytes)
	start := time.Now()
	g.serveUpstream(next, rec, up, failure)
	if g.metrics != nil {
		g.metrics.upstream.WithLabelValues(g.route.Name).Observe(time.Since(start).Seconds())
	}
	a := g.answerOf(rec, failure, ctx.Err())
	a.Request = q.body
	fin, cancelFin := context.WithTimeout(context.WithoutCancel(q.r.Context()), storeTimeout)
	defer cancelFin()
	q.store = fin
	g.finish(w, q, o, a, false)
}

// serveUpstream runs the guarded handler; a panic (net/http's
// ErrAbortHandler when an upstream's body breaks off, or a handler's bug)
// makes the outcome unknown instead of leaving the key unanswered.
func (g *Guard) serveUpstream(next http.Handler, rec *recorder, up *http.Request, failure *upstreamFailure) {
	defer func() {
		if p := recover(); p != nil {
			failure.unknown = true
			if p != http.ErrAbortHandler {
				g.log.Error("the guarded handler panicked: its outcome is unknown", "route", g.route.Name, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			}
		}
	}()
	next.ServeHTTP(rec, up)
}

// await serves a request whose execution another holder claimed: it
// waits for that holder's answer up to pending_timeout.
func (g *Guard) await(w http.ResponseWriter, q *request, o *dedupe.Outcome) {
	deadline := time.Now().Add(g.route.PendingTimeout.D())
	for pause := 5 * time.Millisecond; ; pause = min(pause*2, 200*time.Millisecond) {
		a, found, err := g.kept(q, &o.Decision.Entry)
		switch {
		case err != nil:
			g.unavailable(w, err)
			return
		case found:
			g.finish(w, q, o, a, true) // completes the key if this request owns it
			return
		case !time.Now().Add(pause).Before(deadline):
			g.inProgress(w)
			return
		}
		select {
		case <-q.r.Context().Done():
			return
		case <-time.After(pause):
		}
	}
}

func (g *Guard) inProgress(w http.ResponseWriter) {
	g.count(OutcomeInProgress)
	newProblem(http.StatusConflict, "IDEMPOTENCY_PENDING", "idempotency-pending", "Request in progress",
		"a request with this idempotency key is still being processed; retry after Retry-After with the same key and body").
		write(w, g.route.RetryAfter.D())
}

// answerOf turns what the upstream did into the answer to keep.
func (g *Guard) answerOf(rec *recorder, failure *upstreamFailure, ctxErr error) answer {
	switch {
	case failure.notSent:
		p := newProblem(http.StatusBadGateway, "UPSTREAM_UNREACHABLE", "upstream-unreachable", "Upstream unreachable",
			"the request did not reach the service; retry with the same key and body")
		a := p.answer()
		a.Failed, a.Ended = true, endedUnreachable
		return a
	case failure.unknown || errors.Is(ctxErr, context.DeadlineExceeded):
		p := newProblem(http.StatusGatewayTimeout, "IDEMPOTENCY_OUTCOME_UNKNOWN", "outcome-unknown", "Outcome unknown",
			"the service did not answer in time, or its answer broke off, and it may have acted on the request; every retry with this key gets this answer: check the request's effect before sending it again with a new key")
		a := p.answer()
		a.Ended = endedUnknown
		return a
	case rec.overflow:
		p := newProblem(http.StatusBadGateway, "ANSWER_TOO_LARGE", "answer-too-large", "Answer too large to keep",
			fmt.Sprintf("the service answered %d with a body over %d bytes, more than the idempotency layer keeps; the request was acted on", rec.status, maxAnswerBytes))
		a := p.answer()
		a.Ended = endedTooLarge
		return a
	}
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	a := answer{Status: status, Header: http.Header{}, Body: rec.body, Ended: endedAnswered}
	for _, h := range g.replay {
		if vs := rec.header.Values(h); len(vs) > 0 {
			a.Header[h] = vs
		}
	}
	// An upstream that encodes its body unasked: the body cannot be read
	// without it.
	if vs := rec.header.Values("Content-Encoding"); len(vs) > 0 {
		a.Header["Content-Encoding"] = vs
	}
	a.Failed = !g.stored[status/100]
	return a
}

// resume serves a request that took the key over from a holder that
// stopped or was released (its lease ran out). What that execution kept
// is given. When it kept no answer: if it never claimed the upstream
// call, nothing was called and this request makes the call; if it did,
// the upstream may have acted on the request or not, and the front door
// never calls it twice for one key: the key is answered 502, outcome
// unknown, for its window.
func (g *Guard) resume(w http.ResponseWriter, q *request, o *dedupe.Outcome, next http.Handler) {
	a, found, err := g.kept(q, &o.Decision.Entry)
	if err != nil {
		g.release(q, o)
		g.unavailable(w, err)
		return
	}
	if found {
		g.finish(w, q, o, a, true)
		return
	}
	_, claimed, err := g.claimOf(q, &o.Decision.Entry)
	switch {
	case err != nil:
		g.release(q, o)
		g.unavailable(w, err)
		return
	case !claimed:
		g.call(w, q, o, next)
		return
	}
	g.finish(w, q, o, interrupted(q.body), false)
}

// interrupted is the answer of an execution whose holder stopped while
// the upstream may have been acting on it.
func interrupted(request []byte) answer {
	p := newProblem(http.StatusBadGateway, "IDEMPOTENCY_OUTCOME_UNKNOWN", "outcome-unknown", "Outcome unknown",
		"the first request with this key was interrupted while the service handled it, and may have been acted on; every retry with this key gets this answer: check its effect before sending it again with a new key")
	a := p.answer()
	a.Ended, a.Request = endedInterrupted, request
	return a
}

// finish keeps a (unless an answer is kept already: then that one is
// everybody's), completes the key SUCCESS or FAILED, and answers.
func (g *Guard) finish(w http.ResponseWriter, q *request, o *dedupe.Outcome, a answer, replayed bool) {
	mine := a.encode()
	keptBytes, err := g.store.KeepFirst(q.store, g.policy.Pipeline, answerName(q.key, &o.Decision.Entry), mine, g.keptTTL())
	if err != nil {
		// The key stays PENDING with its call claimed: a retry after the
		// lease is answered outcome unknown; never a second call.
		g.log.Warn("answer not kept", "route", g.route.Name, "err", err)
		g.count(outcomeOf(&a))
		a.write(w, false)
		return
	}
	if k, err := decodeAnswer(keptBytes); err == nil {
		if !bytes.Equal(keptBytes, mine) {
			replayed = true // another holder kept its answer first
		}
		a = k
	}
	state := dedupe.Success
	if a.Failed {
		state = dedupe.Failed
	}
	errs, err := g.store.Complete(q.store, []dedupe.Completion{{
		Namespace: g.policy.Pipeline, Key: o.Key, Owner: o.Decision.Entry.Owner, State: state,
		Result: dedupe.ResultRef{Partition: 0, Offset: 0}, FailedTTL: g.policy.FailedTTL,
	}})
	if err == nil && len(errs) == 1 {
		err = errs[0]
	}
	if err != nil {
		// The answer is kept: a retry that takes the key over finds it.
		g.log.Warn("key not completed", "route", g.route.Name, "err", err)
	}
	outcome := outcomeOf(&a)
	if replayed {
		outcome = OutcomeReplay
	}
	g.count(outcome)
	a.write(w, replayed)
}

func outcomeOf(a *answer) string {
	switch {
	case a.Ended == endedInterrupted:
		return OutcomeInterrupted
	case a.Failed:
		return OutcomeFailed
	}
	return OutcomeFirst
}

// replayed gives a retry the kept answer of its key. A completed key
// whose answer is gone (evicted, or lost with a failover) gets the
// outcome-unknown answer, kept from then on: never a second call.
func (g *Guard) replayed(w http.ResponseWriter, q *request, o *dedupe.Outcome) {
	e := &o.Decision.Entry
	a, found, err := g.kept(q, e)
	if err != nil {
		g.unavailable(w, err)
		return
	}
	if !found {
		if e.State != dedupe.Success {
			g.inProgress(w)
			return
		}
		g.log.Warn("a completed key's answer is gone: answered outcome unknown", "route", g.route.Name)
		lost := interrupted(nil)
		kept, err := g.store.KeepFirst(q.store, g.policy.Pipeline, answerName(q.key, e), lost.encode(), g.keptTTL())
		if err != nil {
			g.unavailable(w, err)
			return
		}
		if a, err = decodeAnswer(kept); err != nil {
			g.unavailable(w, err)
			return
		}
	}
	g.count(OutcomeReplay)
	a.write(w, true)
}

// conflict answers a key reused with another body: 422, naming the JSON
// Pointers where the body differs from the first request's.
func (g *Guard) conflict(w http.ResponseWriter, q *request, o *dedupe.Outcome) {
	p := newProblem(http.StatusUnprocessableEntity, "IDEMPOTENCY_KEY_CONFLICT", "idempotency-key-conflict",
		"Idempotency key reused with another body",
		"this key was first sent with another body (fields a retry may change are ignored); send a new key for a new request")
	if first, found, err := g.firstBody(q, &o.Decision.Entry); err == nil && found && first != nil {
		if paths, err := g.canon.Diff(first, q.body); err == nil {
			p.ConflictPaths = paths
		}
	}
	g.count(OutcomeConflict)
	p.write(w, 0)
}

// upstreamFailure is how a proxy's error handler tells the guard what
// went wrong: never sent (the upstream did not act), or unknown.
type upstreamFailure struct{ notSent, unknown bool }

type failureKey struct{}

// ReportUpstreamError tells the guard of ctx's request how a call of the
// upstream failed: sent false when the request certainly never reached it
// (the connection was refused), so that a retry may call it again; any
// other failure makes the outcome unknown. The proxy's error handler calls
// it; a handler of a Go service may too.
func ReportUpstreamError(ctx context.Context, sent bool) {
	if f, ok := ctx.Value(failureKey{}).(*upstreamFailure); ok {
		if sent {
			f.unknown = true
		} else {
			f.notSent = true
		}
	}
}
