package frontdoor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/dedupe/redisstore"
	"github.com/idemstream/idemstream/frontdoor"
	"github.com/idemstream/idemstream/internal/testenv"
	"github.com/idemstream/idemstream/schemas"
)

// stores runs a test against every store the front door keeps keys in:
// the memory store and a real redis-server, writing either entry format.
func stores(t *testing.T, run func(t *testing.T, store frontdoor.Store)) {
	t.Run("memory", func(t *testing.T) { run(t, memstore.New()) })
	for _, f := range []struct {
		name string
		opts []redisstore.Option
	}{{"redis", nil}, {"redis-compact", []redisstore.Option{redisstore.WithCompactEntries()}}} {
		t.Run(f.name, func(t *testing.T) {
			client := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
			t.Cleanup(func() { _ = client.Close() })
			prefix := fmt.Sprintf("fd%d", time.Now().UnixNano())
			run(t, redisstore.New(client, prefix, f.opts...))
		})
	}
}

const routeYAML = `
store: {kind: memory}
http:
  upstream: http://127.0.0.1:1
  routes:
    - name: coupon-claim
      method: POST
      path: /api/coupon/claim
      key: {name: Idempotency-Key, format: uuid}
      volatile: [/client_time, /retry_count]
      max_payload_bytes: 4096
%s
`

func config(t *testing.T, extra string) *schemas.Config {
	t.Helper()
	cfg, err := schemas.Parse([]byte(fmt.Sprintf(routeYAML, extra)), "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// upstream is a service that counts its calls and answers what answer
// says (200 with a coupon by default).
type upstream struct {
	calls  atomic.Int64
	answer func(w http.ResponseWriter, r *http.Request)
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.calls.Add(1)
	if u.answer != nil {
		u.answer(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Internal", "not replayed")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"coupon":"C-%d","request":%s}`, n, body)
}

func guard(t *testing.T, cfg *schemas.Config, store frontdoor.Store, reg prometheus.Registerer) *frontdoor.Guard {
	t.Helper()
	m, err := frontdoor.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	g, err := frontdoor.NewGuard(cfg, cfg.HTTP.Routes[0], store, frontdoor.Options{Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t testing.TB, h http.Handler, path, key, body string, hdr ...string) reply {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return reply{w.Code, w.Header(), w.Body.String()}
}

func problemOf(t *testing.T, r reply) map[string]any {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json (status %d, body %s)", ct, r.status, r.body)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	key1  = "8e03978e-40d5-43e8-bc93-6894a57f9324"
	key2  = "1f3c1f6e-9a55-4c8e-8d4a-0f2b1c7a2d11"
	claim = `{"user":"u-1","coupon":"VIP300-50","amount":50,"client_time":"%s","retry_count":%d}`
)

// The incident: retries with a new client_time and retry_count are the
// same request; a changed amount is a conflict that names /amount.
func TestIncidentRetriesAreReplaysAndAChangedAmountIsAConflict(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		up := &upstream{}
		reg := prometheus.NewRegistry()
		h := guard(t, config(t, ""), store, reg).Wrap(up)

		first := post(t, h, "/api/coupon/claim", key1, fmt.Sprintf(claim, "12:00:00", 0))
		if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
		}
		for i := 1; i <= 52; i++ {
			r := post(t, h, "/api/coupon/claim", key1, fmt.Sprintf(claim, fmt.Sprintf("12:00:%02d", i), i))
			if r.status != first.status || r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry %d: %d %v %s, want the first answer replayed", i, r.status, r.header, r.body)
			}
			if r.header.Get("Content-Type") != "application/json" || r.header.Get("X-Internal") != "" {
				t.Fatalf("retry %d: headers %v: want Content-Type replayed, X-Internal not", i, r.header)
			}
		}
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("the upstream ran %d times for one key, want 1", n)
		}
		changed := post(t, h, "/api/coupon/claim", key1, `{"user":"u-1","coupon":"VIP300-50","amount":500,"client_time":"12:01:00","retry_count":9}`)
		if changed.status != http.StatusUnprocessableEntity {
			t.Fatalf("changed amount: %d %s, want 422", changed.status, changed.body)
		}
		p := problemOf(t, changed)
		if p["code"] != "IDEMPOTENCY_KEY_CONFLICT" || fmt.Sprint(p["conflict_paths"]) != "[/amount]" {
			t.Fatalf("conflict problem %v, want code IDEMPOTENCY_KEY_CONFLICT and conflict_paths [/amount]", p)
		}
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("a conflict reached the upstream (%d calls)", n)
		}
		for outcome, want := range map[string]float64{"first": 1, "replay": 52, "conflict": 1} {
			if got := testutil.ToFloat64(counter(t, reg, outcome)); got != want {
				t.Errorf("idemstream_http_requests_total{outcome=%q} = %v, want %v", outcome, got, want)
			}
		}
	})
}

func counter(t *testing.T, reg *prometheus.Registry, outcome string) prometheus.Collector {
	t.Helper()
	m, err := frontdoor.NewMetrics(reg) // the same collectors, already registered
	if err != nil {
		t.Fatal(err)
	}
	return frontdoor.RequestsCounter(m, "coupon-claim", outcome)
}

// 200 clients send one key at once: the upstream runs once and every
// client gets the same answer.
func TestConcurrentRetriesRunTheUpstreamOnce(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		release := make(chan struct{})
		up := &upstream{}
		up.answer = func(w http.ResponseWriter, r *http.Request) {
			<-release
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"coupon":"C-%d"}`, up.calls.Load())
		}
		h := guard(t, config(t, ""), store, nil).Wrap(up)
		const clients = 200
		replies := make([]reply, clients)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				replies[i] = post(t, h, "/api/coupon/claim", key1, fmt.Sprintf(claim, time.Now().Format(time.RFC3339Nano), i))
			})
		}
		// Release the upstream once it has been called: the others are
		// then waiting for the first.
		deadline := time.Now().Add(10 * time.Second)
		for up.calls.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the upstream was never called")
			}
			time.Sleep(time.Millisecond)
		}
		close(release)
		wg.Wait()
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("the upstream ran %d times, want 1", n)
		}
		firsts := 0
		for i, r := range replies {
			if r.status != http.StatusOK || r.body != `{"coupon":"C-1"}` {
				t.Fatalf("client %d: %d %s, want 200 {\"coupon\":\"C-1\"}", i, r.status, r.body)
			}
			if r.header.Get("Idempotent-Replayed") == "" {
				firsts++
			}
		}
		if firsts != 1 {
			t.Fatalf("%d answers were not marked replayed, want 1", firsts)
		}
	})
}

// A retry while the first request runs longer than pending_timeout gets
// 409 with Retry-After; once the first has answered, its answer.
func TestRetryWhileInProgressIs409WithRetryAfter(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		release := make(chan struct{})
		up := &upstream{}
		up.answer = func(w http.ResponseWriter, r *http.Request) { <-release; w.WriteHeader(http.StatusAccepted) }
		h := guard(t, config(t, "      pending_timeout: 200ms\n      retry_after: 3s"), store, nil).Wrap(up)
		done := make(chan reply)
		go func() { done <- post(t, h, "/api/coupon/claim", key1, fmt.Sprintf(claim, "a", 0)) }()
		for deadline := time.Now().Add(10 * time.Second); up.calls.Load() == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the upstream was never called")
			}
		}
		r := post(t, h, "/api/coupon/claim", key1, fmt.Sprintf(claim, "b", 1))
		if r.status != http.StatusConflict || r.header.Get("Retry-After") != "3" || problemOf(t, r)["code"] != "IDEMPOTENCY_PENDING" {
			t.Fatalf("retry in progress: %d Retry-After %q %s, want 409 with Retry-After 3", r.status, r.header.Get("Retry-After"), r.body)
		}
		close(release)
		if first := <-done; first.status != http.StatusAccepted {
			t.Fatalf("first: %d", first.status)
		}
		if r := post(t, h, "/api/coupon/claim", key1, fmt.Sprintf(claim, "c", 2)); r.status != http.StatusAccepted || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry after the first: %d %v", r.status, r.header)
		}
	})
}

func TestBadRequestsAreRefusedAndNothingIsStored(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		up := &upstream{}
		h := guard(t, config(t, ""), store, nil).Wrap(up)
		for _, c := range []struct {
			name, key, body string
			status          int
			code            string
		}{
			{"missing key", "", `{}`, 400, "IDEMPOTENCY_KEY_MISSING"},
			{"not a uuid", "coupon-1", `{}`, 400, "IDEMPOTENCY_KEY_INVALID"},
			{"bad sf-string", `"` + key1, `{}`, 400, "IDEMPOTENCY_KEY_INVALID"},
			{"too large", key1, `{"pad":"` + strings.Repeat("x", 5000) + `"}`, 413, "PAYLOAD_TOO_LARGE"},
			{"not JSON", key1, `{"amount":`, 400, "REQUEST_BODY_INVALID"},
		} {
			r := post(t, h, "/api/coupon/claim", c.key, c.body)
			if r.status != c.status || problemOf(t, r)["code"] != c.code {
				t.Errorf("%s: %d %s, want %d %s", c.name, r.status, r.body, c.status, c.code)
			}
		}
		if n := up.calls.Load(); n != 0 {
			t.Fatalf("bad requests reached the upstream %d times", n)
		}
		// None of them took the key: its first valid request runs.
		if r := post(t, h, "/api/coupon/claim", `"`+strings.ToUpper(key1)+`"`, `{"amount":1}`); r.status != http.StatusCreated {
			t.Fatalf("first valid request (an RFC 8941 string, upper case): %d %s", r.status, r.body)
		}
		if r := post(t, h, "/api/coupon/claim", key1, `{"amount":1}`); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the bare lower-case key is the same uuid: %d %v", r.status, r.header)
		}
	})
}

// A key is scoped by the request's path and, with client_header, by the
// client: the same key elsewhere is a new request, not a replay.
func TestKeysAreScopedByPathAndClient(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		up := &upstream{}
		cfg := config(t, "      client_header: X-Api-Key")
		cfg.HTTP.Routes[0].Path = "/api/orders/{id}/pay"
		h := http.NewServeMux()
		h.Handle("POST /api/orders/{id}/pay", guard(t, cfg, store, nil).Wrap(up))
		body := `{"amount":50}`
		for _, c := range []struct{ path, client string }{{"/api/orders/1/pay", "a"}, {"/api/orders/2/pay", "a"}, {"/api/orders/1/pay", "b"}} {
			if r := post(t, h, c.path, key1, body, "X-Api-Key", c.client); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s by %s: %d %v, want a first request", c.path, c.client, r.status, r.header)
			}
		}
		if r := post(t, h, "/api/orders/1/pay", key1, body, "X-Api-Key", "a"); r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the same path and client: %d %v, want a replay", r.status, r.header)
		}
		if n := up.calls.Load(); n != 3 {
			t.Fatalf("upstream calls %d, want 3", n)
		}
	})
}

// An answer outside store_responses fails the key: a retry with the same
// body calls the upstream again (the article's FAILED rule), another body
// is a conflict. With 5xx stored, the 500 is replayed instead.
func TestFailedAnswersAllowARetryUnlessStored(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		up := &upstream{}
		up.answer = func(w http.ResponseWriter, r *http.Request) {
			if up.calls.Load() == 1 {
				http.Error(w, "inventory service down", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusOK)
		}
		h := guard(t, config(t, ""), store, nil).Wrap(up)
		if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusServiceUnavailable {
			t.Fatalf("first: %d", r.status)
		}
		if r := post(t, h, "/api/coupon/claim", key1, `{"amount":60}`); r.status != http.StatusUnprocessableEntity {
			t.Fatalf("another body after a failure: %d %s, want 422", r.status, r.body)
		}
		if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusOK || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("same body after a failure: %d %v, want the upstream called again", r.status, r.header)
		}
		if n := up.calls.Load(); n != 2 {
			t.Fatalf("upstream calls %d, want 2", n)
		}

		stored := &upstream{answer: func(w http.ResponseWriter, r *http.Request) { http.Error(w, "boom", 500) }}
		h = guard(t, config(t, "      store_responses: [2xx, 5xx]"), store, nil).Wrap(stored)
		post(t, h, "/api/coupon/claim", key2, `{"amount":50}`)
		if r := post(t, h, "/api/coupon/claim", key2, `{"amount":50}`); r.status != 500 || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("a stored 500: %d %v, want it replayed", r.status, r.header)
		}
		if n := stored.calls.Load(); n != 1 {
			t.Fatalf("upstream calls %d, want 1", n)
		}
	})
}

// The proxy in front of an upstream that is down: 502, and the key is not
// stored as SUCCESS: once the upstream is back, a retry reaches it.
func TestUpstreamDownStoresNoSuccess(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close() // nothing listens: connections are refused
		cfg := config(t, "")
		cfg.HTTP.Upstream = "http://" + addr
		p, err := frontdoor.NewProxy(cfg, store, frontdoor.Options{})
		if err != nil {
			t.Fatal(err)
		}
		r := post(t, p, "/api/coupon/claim", key1, `{"amount":50}`)
		if r.status != http.StatusBadGateway || problemOf(t, r)["code"] != "UPSTREAM_UNREACHABLE" {
			t.Fatalf("upstream down: %d %s", r.status, r.body)
		}
		pol, _ := cfg.RoutePolicy(cfg.HTTP.Routes[0])
		e, found, err := store.Lookup(context.Background(), pol.Pipeline, "POST /api/coupon/claim "+key1)
		if err != nil || !found || e.State != dedupe.Failed {
			t.Fatalf("entry %+v found %v err %v, want FAILED", e, found, err)
		}

		up := &upstream{}
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("the port was taken meanwhile: %v", err)
		}
		srv := &http.Server{Handler: up}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		if r := post(t, p, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusCreated {
			t.Fatalf("retry once the upstream is back: %d %s", r.status, r.body)
		}
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream calls %d", n)
		}
		// Unguarded paths pass through as they came.
		if r := post(t, p, "/health", "", ``); r.status != http.StatusCreated || up.calls.Load() != 2 {
			t.Fatalf("an unguarded path: %d, calls %d", r.status, up.calls.Load())
		}
	})
}

// The upstream did not answer within upstream_timeout: the outcome is
// unknown, every retry gets 504, and the upstream is not called again.
func TestUpstreamTimeoutIsAnUnknownOutcomeKeptForTheWindow(t *testing.T) {
	store := memstore.New()
	cfg := config(t, "")
	cfg.HTTP.UpstreamTimeout = schemas.Duration(100 * time.Millisecond)
	up := &upstream{}
	up.answer = func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	g, err := frontdoor.NewGuard(cfg, cfg.HTTP.Routes[0], store, frontdoor.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(up)
	for i := range 3 {
		r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
		if r.status != http.StatusGatewayTimeout || problemOf(t, r)["code"] != "IDEMPOTENCY_OUTCOME_UNKNOWN" {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls %d, want 1", n)
	}
}

// Store.KeepFirst never replaces what it kept, on every store.
func TestKeepFirstKeepsTheFirst(t *testing.T) {
	stores(t, func(t *testing.T, store frontdoor.Store) {
		ctx := context.Background()
		if _, found, err := store.Kept(ctx, "ns", "a"); err != nil || found {
			t.Fatalf("Kept before: %v %v", found, err)
		}
		got, err := store.KeepFirst(ctx, "ns", "a", []byte("one"), time.Minute)
		if err != nil || string(got) != "one" {
			t.Fatalf("first keep: %q %v", got, err)
		}
		got, err = store.KeepFirst(ctx, "ns", "a", []byte("two"), time.Minute)
		if err != nil || string(got) != "one" {
			t.Fatalf("second keep: %q %v, want one", got, err)
		}
		if v, found, err := store.Kept(ctx, "ns", "a"); err != nil || !found || !bytes.Equal(v, []byte("one")) {
			t.Fatalf("Kept: %q %v %v", v, found, err)
		}
		if _, found, _ := store.Kept(ctx, "other", "a"); found {
			t.Fatal("a value kept in one namespace was found in another")
		}
	})
}

func canonicalizer(t *testing.T, cfg *schemas.Config) *dedupe.Canonicalizer {
	t.Helper()
	pol, err := cfg.RoutePolicy(cfg.HTTP.Routes[0])
	if err != nil {
		t.Fatal(err)
	}
	c, err := dedupe.NewCanonicalizer(pol.Rules)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func fingerprint(t *testing.T, cfg *schemas.Config, body string) string {
	t.Helper()
	fp, err := canonicalizer(t, cfg).Fingerprint([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

func rulesDigest(t *testing.T, cfg *schemas.Config) string {
	return canonicalizer(t, cfg).RulesDigest()
}

// A key whose entry holds a value the store does not read (a later
// release's format) is refused 500 for good, without Retry-After and
// without calling the upstream; the value is left as it was, and the
// metric says store_refused.
func TestUnreadableEntryIsRefusedForGood(t *testing.T) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = client.Close() })
	prefix := fmt.Sprintf("fdu%d", time.Now().UnixNano())
	reg := prometheus.NewRegistry()
	up := &upstream{}
	h := guard(t, config(t, ""), redisstore.New(client, prefix), reg).Wrap(up)
	if r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`); r.status != http.StatusCreated {
		t.Fatalf("first request: %d %s", r.status, r.body)
	}
	names, err := client.Keys(ctx, prefix+":{*").Result()
	if err != nil || len(names) != 1 {
		t.Fatalf("entries of the prefix: %v, %v; want one", names, err)
	}
	const later = "\x00\x01a later release's entry"
	if err := client.Set(ctx, names[0], later, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	r := post(t, h, "/api/coupon/claim", key1, `{"amount":50}`)
	if r.status != http.StatusInternalServerError || problemOf(t, r)["code"] != "IDEMPOTENCY_STORE_REFUSED" || r.header.Get("Retry-After") != "" {
		t.Errorf("retry over an unreadable entry: %d %v %s, want 500 IDEMPOTENCY_STORE_REFUSED without Retry-After", r.status, r.header, r.body)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("the upstream was called %d times, want once", n)
	}
	if got, _ := client.Get(ctx, names[0]).Result(); got != later {
		t.Errorf("the entry became %q, want it unchanged", got)
	}
	if got := testutil.ToFloat64(counter(t, reg, frontdoor.OutcomeStoreRefused)); got != 1 {
		t.Errorf("store_refused = %v, want 1", got)
	}
}
