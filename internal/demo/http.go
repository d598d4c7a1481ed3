package demo

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/frontdoor"
	"github.com/idemstream/idemstream/schemas"
)

// HTTPFigures is what the campaign sent as HTTP requests shows: straight
// to the incident's endpoint, and through `idemstream proxy`.
type HTTPFigures struct {
	Requests     int            `json:"requests"`
	Users        int            `json:"users"`
	Stock        int            `json:"stock"`
	Injected     map[string]int `json:"injected"`
	Naive        HTTPSide       `json:"naive"`
	Proxy        HTTPSide       `json:"proxy"`
	Conflict     string         `json:"example_conflict"`
	ElapsedMilli int64          `json:"elapsed_ms"`
}

// HTTPSide counts the answers one side gave and the damage its desk did.
type HTTPSide struct {
	UpstreamCalls int `json:"upstream_calls"`
	Created       int `json:"created_201"`
	Replayed      int `json:"replayed"`
	Conflicts     int `json:"conflicts_422"`
	Invalid       int `json:"invalid_400"`
	Refused       int `json:"refused_by_desk"`
	Issued        int `json:"coupons_issued"`
	ExtraCoupons  int `json:"extra_coupons"`
	StockLeft     int `json:"stock_left"`
	MoneyLost     int `json:"money_lost"`
}

const proxyYAML = `
store: {kind: memory}
http:
  upstream: http://%s
  routes:
    - name: coupon-claim
      method: POST
      path: /api/coupon/claim
      key: {name: Idempotency-Key, format: uuid}
      semantics: strict
      window: 10m
      volatile: [/client_time, /retry_count, /trace_id]
      volatile_headers: [X-Retry-Count]
      unordered: [/items]
`

// httpDesk is the coupon endpoint of the incident over HTTP. naive makes
// it dedupe as the incident's backend did, by the key and a hash of the
// body as sent; otherwise it dedupes nothing and relies on what is in
// front of it.
type httpDesk struct {
	desk
	naive bool
	mu    sync.Mutex
	seen  map[string][]byte
	calls int
}

func (d *httpDesk) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	d.calls++
	var id string
	if d.naive {
		sum := sha256.Sum256(body)
		id = r.Header.Get("Idempotency-Key") + ":" + fmt.Sprintf("%x", sum)
		if prev, ok := d.seen[id]; ok {
			d.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(prev)
			return
		}
	}
	d.mu.Unlock()
	out, err := d.claim(body)
	var wrong *wrongAmount
	switch {
	case errors.As(err, &wrong):
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	case err != nil:
		http.Error(w, "not a claim", http.StatusBadRequest)
		return
	}
	if d.naive {
		d.mu.Lock()
		d.seen[id] = out
		d.mu.Unlock()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

// serve starts h on a loopback port and returns its address and a stop.
func serve(h http.Handler) (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { _ = srv.Close(); <-done }, nil
}

// RunHTTP sends the campaign's commands as HTTP requests, once straight to
// the incident's endpoint and once through the front door in front of the
// same endpoint without its naive dedupe, and returns the figures. Every
// server it starts is on a loopback port and stopped before it returns.
func RunHTTP(ctx context.Context, opts Options) (*HTTPFigures, error) {
	started := time.Now()
	w := opts.Workload.withDefaults()
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	gen := Generate(w)
	f := &HTTPFigures{Requests: len(gen.Originals) + len(gen.Later), Users: w.Users, Stock: w.Stock,
		Injected: map[string]int{"volatile_only_retries": gen.Retries, "conflicts": gen.Conflicts, "garbage": gen.Garbage}}

	naive := &httpDesk{desk: desk{stock: w.Stock, issued: map[string]int{}}, naive: true, seen: map[string][]byte{}}
	naiveAddr, stopNaive, err := serve(naive)
	if err != nil {
		return nil, err
	}
	defer stopNaive()
	plain := &httpDesk{desk: desk{stock: w.Stock, issued: map[string]int{}}}
	plainAddr, stopPlain, err := serve(plain)
	if err != nil {
		return nil, err
	}
	defer stopPlain()
	cfg, err := schemas.Parse([]byte(fmt.Sprintf(proxyYAML, plainAddr)), "")
	if err != nil {
		return nil, err
	}
	proxy, err := frontdoor.NewProxy(cfg, memstore.New(), frontdoor.Options{Instance: "demo"})
	if err != nil {
		return nil, err
	}
	proxyAddr, stopProxy, err := serve(proxy)
	if err != nil {
		return nil, err
	}
	defer stopProxy()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	for _, side := range []struct {
		addr string
		into *HTTPSide
		desk *httpDesk
	}{{naiveAddr, &f.Naive, naive}, {proxyAddr, &f.Proxy, plain}} {
		var mu sync.Mutex
		count := func(status int, replayed bool, body []byte) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case replayed || status == http.StatusOK:
				side.into.Replayed++
			case status == http.StatusCreated:
				side.into.Created++
			case status == http.StatusUnprocessableEntity && bytes.Contains(body, []byte("IDEMPOTENCY_KEY_CONFLICT")):
				side.into.Conflicts++
				if f.Conflict == "" {
					f.Conflict = strings.TrimSpace(string(body))
				}
			case status == http.StatusBadRequest && bytes.Contains(body, []byte(`"code"`)):
				side.into.Invalid++
			default:
				side.into.Refused++
			}
		}
		for _, batch := range [][]Command{gen.Originals, gen.Later} {
			if err := sendHTTP(ctx, client, side.addr, batch, count); err != nil {
				return nil, err
			}
		}
		side.desk.mu.Lock()
		side.into.UpstreamCalls = side.desk.calls
		side.desk.mu.Unlock()
		side.into.Issued, side.into.ExtraCoupons = side.desk.damage()
		side.into.StockLeft = w.Stock - side.into.Issued
		side.into.MoneyLost = side.into.ExtraCoupons * CouponValue
	}
	f.ElapsedMilli = time.Since(started).Milliseconds()
	return f, nil
}

// sendHTTP posts cmds from 16 clients at once, as a crowd of phones
// would, and counts each answer.
func sendHTTP(ctx context.Context, client *http.Client, addr string, cmds []Command, count func(int, bool, []byte)) error {
	work := make(chan Command)
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for c := range work {
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/api/coupon/claim", bytes.NewReader(c.Body))
				if err != nil {
					errs <- err
					return
				}
				req.Header.Set("Content-Type", "application/json")
				if c.IdemKey != "" {
					req.Header.Set("Idempotency-Key", c.IdemKey)
				}
				resp, err := client.Do(req)
				if err != nil {
					errs <- fmt.Errorf("demo request: %w", err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				count(resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", body)
			}
		})
	}
	var err error
feed:
	for _, c := range cmds {
		select {
		case work <- c:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

// Print writes the table of the HTTP campaign.
func (f *HTTPFigures) Print(w io.Writer) {
	fmt.Fprintf(w, "\nThe coupon campaign over HTTP: %d users, %d POST /api/coupon/claim requests, %d coupons in stock (worth %d each).\n",
		f.Users, f.Requests, f.Stock, CouponValue)
	fmt.Fprintf(w, "Injected: %d volatile-only retries, %d keys reused with another amount, %d garbage requests.\n\n",
		f.Injected["volatile_only_retries"], f.Injected["conflicts"], f.Injected["garbage"])
	rows := []struct {
		label string
		get   func(HTTPSide) int
	}{
		{"upstream calls", func(s HTTPSide) int { return s.UpstreamCalls }},
		{"201 created", func(s HTTPSide) int { return s.Created }},
		{"replayed answers", func(s HTTPSide) int { return s.Replayed }},
		{"422 key conflicts", func(s HTTPSide) int { return s.Conflicts }},
		{"400 invalid", func(s HTTPSide) int { return s.Invalid }},
		{"refused by the desk", func(s HTTPSide) int { return s.Refused }},
		{"coupons issued", func(s HTTPSide) int { return s.Issued }},
		{"extra coupons", func(s HTTPSide) int { return s.ExtraCoupons }},
		{"stock left", func(s HTTPSide) int { return s.StockLeft }},
		{"money lost", func(s HTTPSide) int { return s.MoneyLost }},
	}
	fmt.Fprintf(w, "  %-24s %14s %14s\n", "", "naive endpoint", "through proxy")
	fmt.Fprintf(w, "  %s\n", strings.Repeat("-", 56))
	for _, r := range rows {
		fmt.Fprintf(w, "  %-24s %14d %14d\n", r.label, r.get(f.Naive), r.get(f.Proxy))
	}
	if f.Conflict != "" {
		fmt.Fprintf(w, "\nA key reused with another amount is answered 422:\n  %s\n", f.Conflict)
	}
	fmt.Fprintf(w, "\nFinished in %.1fs.\n", float64(f.ElapsedMilli)/1000)
}
