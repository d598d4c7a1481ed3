package frontdoor

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a guarded request, the outcome label of
// idemstream_http_requests_total.
const (
	OutcomeFirst            = "first"             // the upstream was called and its answer kept
	OutcomeReplay           = "replay"            // a retry given the kept answer
	OutcomeConflict         = "conflict"          // 422: the key with another body
	OutcomeInProgress       = "in_progress"       // 409: the first still running after pending_timeout
	OutcomeInvalid          = "invalid"           // 400: no key, a malformed key or body
	OutcomeTooLarge         = "too_large"         // 413: a body over max_payload_bytes
	OutcomeFailed           = "failed"            // the upstream's answer is not stored: the key is FAILED
	OutcomeInterrupted      = "interrupted"       // a key taken over from a stopped holder with nothing kept
	OutcomeUnguarded        = "unguarded"         // no key, key_required false: passed on as it came
	OutcomeStoreUnavailable = "store_unavailable" // 503: the store did not answer; the upstream was not called
	OutcomeStoreRefused     = "store_refused"     // 500: the store answered that it cannot decide the key; the upstream was not called
)

// Metrics are the front door's collectors; one set serves every route.
type Metrics struct {
	requests *prometheus.CounterVec
	upstream *prometheus.HistogramVec
}

// NewMetrics registers the front door's metrics on reg (nil: a private
// registry, nothing exported).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemstream_http_requests_total",
			Help: "Requests of guarded routes, by outcome (first, replay, conflict, in_progress, invalid, too_large, failed, interrupted, unguarded, store_unavailable).",
		}, []string{"route", "outcome"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemstream_http_upstream_duration_seconds",
			Help:    "Time the upstream (the guarded handler) took to answer a first request.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"route"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.upstream} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			switch existing := are.ExistingCollector.(type) {
			case *prometheus.CounterVec:
				m.requests = existing
			case *prometheus.HistogramVec:
				m.upstream = existing
			}
		}
	}
	return m, nil
}
