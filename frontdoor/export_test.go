package frontdoor

import "github.com/prometheus/client_golang/prometheus"

// RequestsCounter is one series of idemstream_http_requests_total, for
// the black-box tests.
func RequestsCounter(m *Metrics, route, outcome string) prometheus.Collector {
	return m.requests.WithLabelValues(route, outcome)
}
