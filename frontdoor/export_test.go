package frontdoor

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemstream/idemstream/dedupe"
)

// RequestsCounter is one series of idemstream_http_requests_total, for
// the black-box tests.
func RequestsCounter(m *Metrics, route, outcome string) prometheus.Collector {
	return m.requests.WithLabelValues(route, outcome)
}

// ClaimName and AnswerName are the names a guard keeps an execution's
// claim and answer under, for tests that play a holder that stopped.
func ClaimName(scopedKey string, e *dedupe.Entry) string {
	return claimName(scopedKey, e)
}

func AnswerName(scopedKey string, e *dedupe.Entry) string {
	return answerName(scopedKey, e)
}

// ShortenStoreTimeout sets the store budget of a request's phases for one
// test.
func ShortenStoreTimeout(t interface{ Cleanup(func()) }, d time.Duration) {
	old := storeTimeout
	storeTimeout = d
	t.Cleanup(func() { storeTimeout = old })
}
