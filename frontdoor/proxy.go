package frontdoor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"syscall"
	"time"

	"github.com/idemstream/idemstream/dedupe"
	"github.com/idemstream/idemstream/schemas"
)

// Proxy is `idemstream proxy`: a reverse proxy in front of cfg.HTTP's
// upstream whose routes are guarded; every other request passes as it
// came. It is an http.Handler and starts no goroutine.
type Proxy struct {
	mux   *http.ServeMux
	store Store
}

// NewProxy builds the proxy of cfg.HTTP over store.
func NewProxy(cfg *schemas.Config, store Store, o Options) (*Proxy, error) {
	if cfg.HTTP == nil {
		return nil, &schemas.FieldError{Field: "http", Msg: "the proxy needs an http section with its routes"}
	}
	if cfg.HTTP.Upstream == "" {
		return nil, &schemas.FieldError{Field: "http.upstream", Msg: "the proxy needs the URL of the service it stands in front of"}
	}
	target, err := url.Parse(cfg.HTTP.Upstream)
	if err != nil || target.Host == "" || (target.Scheme != "http" && target.Scheme != "https") {
		return nil, &schemas.FieldError{Field: "http.upstream", Msg: fmt.Sprintf("%q is not an http:// or https:// URL", cfg.HTTP.Upstream)}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host
		},
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: cfg.HTTP.UpstreamTimeout.D(),
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			sent := !neverSent(err)
			ReportUpstreamError(r.Context(), sent)
			o.Logger.Warn("upstream call failed", "method", r.Method, "path", r.URL.Path, "sent", sent, "err", err)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	p := &Proxy{mux: http.NewServeMux(), store: store}
	p.mux.Handle("/", rp)
	for _, r := range cfg.HTTP.Routes {
		g, err := NewGuard(cfg, r, store, o)
		if err != nil {
			return nil, err
		}
		p.mux.Handle(r.Method+" "+r.Path, g.Wrap(rp))
	}
	return p, nil
}

// neverSent: the connection to the upstream was never made, so it cannot
// have acted on the request.
func neverSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

// Ready reports whether the store answers and can keep answers: while it
// cannot, every guarded request is refused 503 and nothing reaches the
// upstream.
func (p *Proxy) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := dedupe.Probe(ctx, p.store); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	// A store that forgot decisions refuses every decision until the loss
	// is accepted or has aged out of the window.
	if f, ok := p.store.(interface{ Forgot() error }); ok {
		if err := f.Forgot(); err != nil {
			return fmt.Errorf("store: %w", err)
		}
	}
	// A store that decides but cannot keep answers (a Redis before 7.0
	// refuses SET NX GET) would refuse every guarded request.
	if _, err := p.store.KeepFirst(ctx, "idemstream-readyz", "probe", []byte("1"), time.Minute); err != nil {
		return fmt.Errorf("store cannot keep answers (the front door needs Redis 7.0 or later): %w", err)
	}
	return nil
}
