package frontdoor_test

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/dedupe/storetest"
	"github.com/idemstream/idemstream/frontdoor"
	"github.com/idemstream/idemstream/schemas"
)

const scopedKey1 = "POST /api/coupon/claim " + key1

// stoppedHolder makes the decision of a holder that then stops, as a
// guard makes it: owner, attempt and all. claimed: it had claimed the
// upstream call (so the upstream may have acted); answer: it had kept an
// answer too.
func stoppedHolder(t *testing.T, cfg *schemas.Config, store frontdoor.Store, body string, claimed bool, answer string) dedupe.Entry {
	t.Helper()
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	ctx := context.Background()
	d, err := store.Decide(ctx, []dedupe.DecideRequest{{
		Namespace: pol.Pipeline, Key: scopedKey1, Fingerprint: fingerprint(t, cfg, body),
		RulesDigest: rulesDigest(t, cfg), Semantics: pol.Semantics, Window: pol.Window, Lease: pol.Lease(),
		Owner:  dedupe.Owner{Holder: "stopped/1", Source: "http/coupon-claim/stopped/0/1"},
		Intent: dedupe.Intent{Partition: 0, Floor: 77},
	}})
	if err != nil || d[0].Verdict != dedupe.VerdictFirst {
		t.Fatalf("the stopped holder's decision: %+v %v", d, err)
	}
	e := d[0].Entry
	if claimed {
		c, _ := json.Marshal(map[string]any{"holder": "stopped/1", "request": []byte(body)})
		if _, err := store.KeepFirst(ctx, pol.Pipeline, frontdoor.ClaimName(scopedKey1, &e), c, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if answer != "" {
		if _, err := store.KeepFirst(ctx, pol.Pipeline, frontdoor.AnswerName(scopedKey1, &e), []byte(answer), time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func manualStore() (*storetest.ManualClock, *memstore.Store) {
	clock := storetest.NewManualClock()
	return clock, memstore.New(memstore.WithClock(clock.Now))
}

// A holder that stopped after it claimed the upstream call leaves the key
// PENDING: retries are 409 until the lease runs out, then the key is
// taken over and answered outcome unknown, without a second call, for
// the rest of its window (at least half of it: config refuses a window
// shorter than twice the lease).
func TestTakeoverAfterAStoppedHolderNeverCallsTwice(t *testing.T) {
	clock, store := manualStore()
	cfg := config(t, "      window: 2m\n      pending_timeout: 50ms")
	up := &upstream{}
	h := guard(t, cfg, store, nil).Wrap(up)
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	stoppedHolder(t, cfg, store, `{"amount":50}`, true, "")
	if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusConflict {
		t.Fatalf("within the lease: %d %s, want 409", r.status, r.body)
	}
	clock.Advance(pol.Lease() + time.Second)
	r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	if r.status != http.StatusBadGateway || problemOf(t, r)["code"] != "IDEMPOTENCY_OUTCOME_UNKNOWN" {
		t.Fatalf("after the lease: %d %s, want 502 outcome unknown", r.status, r.body)
	}
	for _, after := range []time.Duration{0, pol.Window - pol.Lease() - 2*time.Second} {
		clock.Advance(after)
		again := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
		if again.status != r.status || again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("a retry %v later: %d %s, want the same answer replayed", after, again.status, again.body)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("the upstream was called %d times after the takeover", n)
	}
}

// A holder that kept its answer and stopped before completing: the retry
// that takes the key over is given that answer, and so is every retry
// for the rest of the window.
func TestAKeptAnswerOfAStoppedHolderIsReplayed(t *testing.T) {
	clock, store := manualStore()
	cfg := config(t, "      pending_timeout: 50ms")
	up := &upstream{}
	h := guard(t, cfg, store, nil).Wrap(up)
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	stoppedHolder(t, cfg, store, `{"amount":50}`, true, `{"status":201,"body":"eyJjb3Vwb24iOiJDLTAifQ==","ended":"answered"}`)
	clock.Advance(pol.Lease() + time.Second)
	first := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	if first.status != http.StatusCreated || first.body != `{"coupon":"C-0"}` {
		t.Fatalf("the takeover: %d %s, want the kept 201", first.status, first.body)
	}
	clock.Advance(pol.Window - pol.Lease() - 2*time.Second)
	if again := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); again.body != first.body {
		t.Fatalf("at the end of the window: %d %s, want the kept answer", again.status, again.body)
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("the upstream was called %d times", n)
	}
}

// A decision whose answer was lost (a store timeout after the write)
// leaves a PENDING key that no request claimed. The refused request
// releases it, so its retry makes the one upstream call at once; if the
// release is lost too, the retry waits out the lease first.
func TestAnUnclaimedKeyIsCalledOnce(t *testing.T) {
	for _, releaseLost := range []bool{false, true} {
		t.Run(fmt.Sprintf("release lost %v", releaseLost), func(t *testing.T) {
			clock, mem := manualStore()
			store := &decideThenFail{Store: mem}
			store.fail.Store(true)
			store.failComplete.Store(releaseLost)
			cfg := config(t, "      pending_timeout: 50ms")
			pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
			up := &upstream{}
			h := guard(t, cfg, store, nil).Wrap(up)
			if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusServiceUnavailable || problemOf(t, r)["code"] != "IDEMPOTENCY_STORE_UNAVAILABLE" {
				t.Fatalf("a decision without an answer: %d %s, want 503", r.status, r.body)
			}
			if releaseLost {
				if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusConflict {
					t.Fatalf("within the lease: %d, want 409", r.status)
				}
				clock.Advance(pol.Lease() + time.Second)
			}
			if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusCreated {
				t.Fatalf("the retry: %d %s, want the upstream's 201", r.status, r.body)
			}
			if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("then: %d %v, want a replay", r.status, r.header)
			}
			if n := up.calls.Load(); n != 1 {
				t.Fatalf("upstream calls %d, want 1", n)
			}
		})
	}
}

// decideThenFail applies a decision and reports the store unavailable, as
// a Redis call whose reply was lost after the script ran; failComplete
// loses the next completion as well.
type decideThenFail struct {
	*memstore.Store
	fail, failComplete atomic.Bool
}

func (s *decideThenFail) Decide(ctx context.Context, reqs []dedupe.DecideRequest) ([]dedupe.Decision, error) {
	d, err := s.Store.Decide(ctx, reqs)
	if s.fail.CompareAndSwap(true, false) {
		return nil, fmt.Errorf("%w: i/o timeout", dedupe.ErrStoreUnavailable)
	}
	return d, err
}

func (s *decideThenFail) Complete(ctx context.Context, comps []dedupe.Completion) ([]error, error) {
	if s.failComplete.CompareAndSwap(true, false) {
		return nil, fmt.Errorf("%w: i/o timeout", dedupe.ErrStoreUnavailable)
	}
	return s.Store.Complete(ctx, comps)
}

// A holder slower than its lease and the request that took its key over
// give one answer between them, whatever the upstream answered.
func TestASlowHolderAndItsTakerGiveOneAnswer(t *testing.T) {
	for _, status := range []int{http.StatusCreated, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			clock, store := manualStore()
			cfg := config(t, "      pending_timeout: 50ms")
			pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
			entered, release := make(chan struct{}), make(chan struct{})
			up := &upstream{}
			up.answer = func(w http.ResponseWriter, r *http.Request) {
				if up.calls.Load() == 1 {
					close(entered)
					<-release
				}
				w.WriteHeader(status)
			}
			h := guard(t, cfg, store, nil).Wrap(up)
			done := make(chan reply)
			go func() { done <- post(t, h, "/api/coupon/claim", key1, `{"amount":50}`) }()
			<-entered
			clock.Advance(pol.Lease() + time.Second) // the holder is late (or the store's clock stepped)
			taker := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
			close(release)
			holder := <-done
			later := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
			if up.calls.Load() > 1 && status < 300 {
				t.Fatalf("a succeeded key was called %d times", up.calls.Load())
			}
			if status < 300 && (holder.status != later.status || taker.status != later.status) {
				t.Errorf("holder %d, taker %d, later %d: want one answer", holder.status, taker.status, later.status)
			}
			if holder.status != taker.status && taker.status != http.StatusConflict {
				t.Errorf("holder %d, taker %d: two answers for one execution", holder.status, taker.status)
			}
		})
	}
}

// An upstream that breaks off its answer (ReverseProxy then aborts the
// handler with a panic) is an unknown outcome: answered and kept, the key
// not left PENDING.
func TestABrokenUpstreamAnswerIsAnUnknownOutcome(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 4096)
				_, _ = c.Read(buf)
				_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"coupon\":")
				_ = c.Close()
			}()
		}
	}()
	store := memstore.New()
	cfg := config(t, "")
	cfg.HTTP.Upstream = "http://" + ln.Addr().String()
	p, err := frontdoor.NewProxy(cfg, store, frontdoor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/coupon/claim", strings.NewReader(`{"amount":50}`))
		req.Header.Set("Idempotency-Key", key1)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(b), "IDEMPOTENCY_OUTCOME_UNKNOWN") {
			t.Fatalf("request %d: %d %s, want 504 outcome unknown", i, resp.StatusCode, b)
		}
	}
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	if e, _, _ := store.Lookup(context.Background(), pol.Pipeline, scopedKey1); e.State != dedupe.Success {
		t.Fatalf("entry %s, want SUCCESS (the unknown outcome kept)", e.State)
	}
}

// Informational answers (103 Early Hints; 100 Continue for a client that
// sent Expect: 100-continue) are not the answer: the final one is kept.
func TestInformationalAnswersAreNotTheAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		expect bool
		hints  bool
	}{{"early hints", false, true}, {"expect 100-continue", true, false}} {
		t.Run(c.name, func(t *testing.T) {
			up := &upstream{}
			if c.hints {
				up.answer = func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Link", "</style.css>; rel=preload")
					w.WriteHeader(http.StatusEarlyHints)
					w.WriteHeader(http.StatusCreated)
					_, _ = io.WriteString(w, `{"coupon":"C"}`)
				}
			}
			usrv := httptest.NewServer(up)
			defer usrv.Close()
			cfg := config(t, "")
			cfg.HTTP.Upstream = usrv.URL
			p, err := frontdoor.NewProxy(cfg, memstore.New(), frontdoor.Options{})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(p)
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Second}}
			defer client.CloseIdleConnections()
			for i := range 2 {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/coupon/claim", strings.NewReader(`{"amount":50}`))
				req.Header.Set("Idempotency-Key", key1)
				if c.expect {
					req.Header.Set("Expect", "100-continue")
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					t.Fatalf("request %d: %d, want 201", i, resp.StatusCode)
				}
			}
			if n := up.calls.Load(); n != 1 {
				t.Fatalf("upstream calls %d, want 1", n)
			}
		})
	}
}

// After a rules change, the same body on a key whose first request left
// nothing to compare with is not a conflict: it is decided again.
func TestARulesChangeOnAnUnclaimedKeyIsNotAConflict(t *testing.T) {
	clock, store := manualStore()
	old := config(t, "      pending_timeout: 50ms")
	body := `{"amount":50,"trace":"t-1"}`
	stoppedHolder(t, old, store, body, false, "")
	cfg := config(t, "      pending_timeout: 50ms")
	cfg.HTTP.Routes[0].Volatile = append(cfg.HTTP.Routes[0].Volatile, "/trace")
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	up := &upstream{}
	h := guard(t, cfg, store, nil).Wrap(up)
	clock.Advance(pol.Lease() + time.Second)
	if r := post(t, h, "/api/coupon/claim", key1, body); r.status != http.StatusCreated {
		t.Fatalf("the same body after a rules change: %d %s, want it handled", r.status, r.body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls %d", n)
	}
}

// The store calls after a slow upstream get a budget of their own: an
// answer that took longer than the store budget is still kept, and a
// retry waiting longer than it still gets the answer, not a 503.
func TestASlowUpstreamAnswerIsKept(t *testing.T) {
	frontdoor.ShortenStoreTimeout(t, 200*time.Millisecond)
	clock, store := manualStore()
	cfg := config(t, "      pending_timeout: 1s")
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	entered := make(chan struct{})
	up := &upstream{}
	up.answer = func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		time.Sleep(500 * time.Millisecond) // longer than the store budget, well inside upstream_timeout
		w.WriteHeader(http.StatusCreated)
	}
	h := guard(t, cfg, store, nil).Wrap(up)
	done := make(chan reply)
	go func() { done <- post(t, h, "/api/coupon/claim", key1, `{"amount":50}`) }()
	<-entered
	waiter := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	first := <-done
	if first.status != http.StatusCreated || waiter.status != http.StatusCreated || waiter.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d, a retry that waited for it %d %s: want 201 and the replayed 201", first.status, waiter.status, waiter.body)
	}
	clock.Advance(pol.Lease() + time.Second)
	if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a retry after the lease: %d %s, want the kept 201", r.status, r.body)
	}
	if e, _, _ := store.Lookup(context.Background(), pol.Pipeline, scopedKey1); e.State != dedupe.Success {
		t.Fatalf("entry %s, want SUCCESS", e.State)
	}
}

// claimReplyLost lands the first claim and reports the store unavailable,
// as a Redis call whose reply was lost (or whose WAIT fell short).
type claimReplyLost struct {
	*memstore.Store
	done atomic.Bool
}

func (s *claimReplyLost) KeepFirst(ctx context.Context, ns, name string, v []byte, ttl time.Duration) ([]byte, error) {
	b, err := s.Store.KeepFirst(ctx, ns, name, v, ttl)
	if strings.HasSuffix(name, "\x00call") && s.done.CompareAndSwap(false, true) {
		return nil, fmt.Errorf("keep: %w: i/o timeout", dedupe.ErrStoreUnavailable)
	}
	return b, err
}

// A claim that landed though its reply was lost is still this request's:
// asked again, the store says so, and the one call is made.
func TestALostClaimReplyStillCallsOnce(t *testing.T) {
	_, mem := manualStore()
	store := &claimReplyLost{Store: mem}
	cfg := config(t, "      pending_timeout: 50ms")
	up := &upstream{}
	h := guard(t, cfg, store, nil).Wrap(up)
	first := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	retry := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	if first.status != http.StatusCreated || retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "true" || up.calls.Load() != 1 {
		t.Fatalf("first %d, retry %d %s, upstream calls %d: want 201, the replayed 201, 1", first.status, retry.status, retry.body, up.calls.Load())
	}
}

// lateClaim holds the first claim write until a second claim arrives,
// then lets it land first: a holder and the request that took its key
// over, the taker left to wait for the holder's answer.
type lateClaim struct {
	*memstore.Store
	n                    atomic.Int32
	first, wrote, landed chan struct{}
}

func (s *lateClaim) KeepFirst(ctx context.Context, ns, name string, v []byte, ttl time.Duration) ([]byte, error) {
	if strings.HasSuffix(name, "\x00call") {
		switch s.n.Add(1) {
		case 1:
			close(s.first)
			<-s.wrote
			defer close(s.landed)
			return s.Store.KeepFirst(ctx, ns, name, v, ttl)
		case 2:
			s.wrote <- struct{}{}
			<-s.landed // the holder's claim lands first
		}
	}
	return s.Store.KeepFirst(ctx, ns, name, v, ttl)
}

// A taker that lost the claim and found the holder's answer completes the
// key it now owns: later retries are replays, not 409s for its lease.
func TestATakerThatWaitedCompletesTheKey(t *testing.T) {
	clock, mem := manualStore()
	store := &lateClaim{Store: mem, first: make(chan struct{}), wrote: make(chan struct{}), landed: make(chan struct{})}
	cfg := config(t, "      pending_timeout: 1s")
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	up := &upstream{}
	h := guard(t, cfg, store, nil).Wrap(up)
	done := make(chan reply)
	go func() { done <- post(t, h, "/api/coupon/claim", key1, `{"amount":50}`) }()
	<-store.first
	clock.Advance(pol.Lease() + time.Second)
	taker := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	holder := <-done
	if e, _, _ := mem.Lookup(context.Background(), pol.Pipeline, scopedKey1); e.State != dedupe.Success {
		t.Fatalf("holder %d, taker %d: entry %s, want SUCCESS", holder.status, taker.status, e.State)
	}
	later := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	if later.status != holder.status || taker.status != holder.status || later.header.Get("Idempotent-Replayed") != "true" || up.calls.Load() != 1 {
		t.Fatalf("holder %d, taker %d, later %d, calls %d: want one answer, replayed, one call", holder.status, taker.status, later.status, up.calls.Load())
	}
}

// An upstream that acted on the request and then broke the connection is
// called once: the proxy's client must not send the request again on its
// own (net/http would, for a request with an Idempotency-Key header and a
// body it can rewind).
func TestABrokenConnectionIsNotResent(t *testing.T) {
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if calls.Add(1) == 2 { // the second key's first call: acted on, then cut
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer up.Close()
	p := proxyTo(t, up.URL, memstore.New())
	// The first key opens the kept-alive connection the second reuses.
	if r := post(t, p, "/api/coupon/claim", key1, `{"a":1}`); r.status != http.StatusOK {
		t.Fatalf("first key: %d %s", r.status, r.body)
	}
	r := post(t, p, "/api/coupon/claim", key2, `{"a":1}`)
	if n := calls.Load(); n != 2 {
		t.Fatalf("upstream calls %d, want 2 (one per key): the cut request was sent again", n)
	}
	if r.status != http.StatusGatewayTimeout || problemOf(t, r)["code"] != "IDEMPOTENCY_OUTCOME_UNKNOWN" {
		t.Fatalf("cut after acting: %d %s, want 504 outcome unknown", r.status, r.body)
	}
}

// The answer kept is the decoded one: the client's Accept-Encoding is not
// passed on, so a retry from a client that cannot decode gzip reads it.
func TestAnswersAreKeptDecoded(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") && r.Header.Get("X-Test-Raw") != "" {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = zw.Write([]byte(`{"ok":true}`))
			_ = zw.Close()
			return
		}
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer up.Close()
	p := proxyTo(t, up.URL, memstore.New())
	first := post(t, p, "/api/coupon/claim", key1, `{"a":1}`, "Accept-Encoding", "gzip", "X-Test-Raw", "1")
	retry := post(t, p, "/api/coupon/claim", key1, `{"a":1}`)
	for _, r := range []reply{first, retry} {
		if r.body != `{"ok":true}` || r.header.Get("Content-Encoding") != "" {
			t.Fatalf("answer %q with Content-Encoding %q, want the decoded body", r.body, r.header.Get("Content-Encoding"))
		}
	}
}

// A route without a body (DELETE /orders/{id}) is guarded like any other:
// its requests are one request under their key.
func TestARouteWithoutABody(t *testing.T) {
	up := &upstream{answer: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }}
	cfg := config(t, "")
	cfg.HTTP.Routes[0].Method, cfg.HTTP.Routes[0].Path = http.MethodDelete, "/api/orders/{id}"
	g := guard(t, cfg, memstore.New(), nil)
	mux := http.NewServeMux()
	mux.Handle("DELETE /api/orders/{id}", g.Wrap(up))
	for i := range 2 {
		req := httptest.NewRequest(http.MethodDelete, "/api/orders/7", nil)
		req.Header.Set("Idempotency-Key", key1)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code != http.StatusNoContent || (i == 1) != (w.Header().Get("Idempotent-Replayed") == "true") {
			t.Fatalf("request %d: %d %v", i, w.Code, w.Header())
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls %d, want 1", n)
	}
}

// While Options.Ready says no, guarded requests are refused 503 and
// nothing is decided.
func TestNotReadyRefusesBeforeDeciding(t *testing.T) {
	store := memstore.New()
	cfg := config(t, "")
	up := &upstream{}
	var ready atomic.Bool
	g, err := frontdoor.NewGuard(cfg, cfg.HTTP.Routes[0], store, frontdoor.Options{Ready: func() error {
		if !ready.Load() {
			return errors.New("store settings not checked yet")
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(up)
	if r := post(t, h, "/api/coupon/claim", key1, `{"a":1}`); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("not ready: %d %v", r.status, r.header)
	}
	pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	if _, found, _ := store.Lookup(context.Background(), pol.Pipeline, scopedKey1); found {
		t.Fatal("a request refused as not ready left an entry")
	}
	ready.Store(true)
	if r := post(t, h, "/api/coupon/claim", key1, `{"a":1}`); r.status != http.StatusCreated || up.calls.Load() != 1 {
		t.Fatalf("ready: %d, calls %d", r.status, up.calls.Load())
	}
}

// cannotKeep is a store that decides but refuses to keep values, as a
// Redis before 7.0 refuses SET NX GET.
type cannotKeep struct{ *memstore.Store }

func (cannotKeep) KeepFirst(context.Context, string, string, []byte, time.Duration) ([]byte, error) {
	return nil, errors.New("keep: redis refused: ERR syntax error")
}

// The proxy is not ready on a store that cannot keep answers.
func TestProxyIsNotReadyOnAStoreThatCannotKeep(t *testing.T) {
	cfg := config(t, "")
	for _, c := range []struct {
		store frontdoor.Store
		ready bool
	}{{memstore.New(), true}, {cannotKeep{memstore.New()}, false}} {
		p, err := frontdoor.NewProxy(cfg, c.store, frontdoor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Ready(context.Background()); (err == nil) != c.ready {
			t.Fatalf("%T: Ready = %v, want ready %v", c.store, err, c.ready)
		}
	}
}

// lookupAnswers is a store whose Lookup answers err.
type lookupAnswers struct {
	*memstore.Store
	err error
}

func (s lookupAnswers) Lookup(context.Context, string, string) (dedupe.Entry, bool, error) {
	return dedupe.Entry{}, false, s.err
}

// A stray value at the probe's name is an answer: the proxy is ready; a
// store that does not answer makes it not ready.
func TestProxyReadyOverAnUnreadableProbeValue(t *testing.T) {
	cfg := config(t, "")
	for _, c := range []struct {
		err   error
		ready bool
	}{
		{fmt.Errorf("entry x: %w", dedupe.ErrEntryUnreadable), true},
		{fmt.Errorf("lookup: %w", dedupe.ErrStoreUnavailable), false},
	} {
		p, err := frontdoor.NewProxy(cfg, lookupAnswers{memstore.New(), c.err}, frontdoor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Ready(context.Background()); (err == nil) != c.ready {
			t.Errorf("Lookup answering %v: Ready = %v, want ready %v", c.err, err, c.ready)
		}
	}
}

// proxyTo is a proxy of the test route in front of upstream.
func proxyTo(t *testing.T, upstream string, store frontdoor.Store) *frontdoor.Proxy {
	t.Helper()
	cfg := config(t, "")
	cfg.HTTP.Upstream = upstream
	p, err := frontdoor.NewProxy(cfg, store, frontdoor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
