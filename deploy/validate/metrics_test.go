package validate

import (
	"reflect"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// TestMetricsAsDocumented: the series deploy/README.md ("Metrics") promises exist, with its
// types and labels. The rules, the dashboard and deploy/README.md rely on
// exactly these.
func TestMetricsAsDocumented(t *testing.T) {
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"idemstream_records_total":             {dto.MetricType_COUNTER, []string{"outcome", "pipeline"}},
		"idemstream_dlq_records_total":         {dto.MetricType_COUNTER, []string{"pipeline", "reason"}},
		"idemstream_lenient_mismatch_total":    {dto.MetricType_COUNTER, []string{"pipeline"}},
		"idemstream_consumer_lag":              {dto.MetricType_GAUGE, []string{"partition", "pipeline"}},
		"idemstream_decision_duration_seconds": {dto.MetricType_HISTOGRAM, []string{"pipeline"}},
		"idemstream_store_duration_seconds":    {dto.MetricType_HISTOGRAM, []string{"op"}},
		"idemstream_store_errors_total":        {dto.MetricType_COUNTER, []string{"op"}},
		"idemstream_rebalances_total":          {dto.MetricType_COUNTER, []string{"pipeline"}},
		"idemstream_inflight_records":          {dto.MetricType_GAUGE, []string{"pipeline"}},
		"idemstream_build_info":                {dto.MetricType_GAUGE, []string{"go_version", "version"}},
		"idemstream_store_settings_ok":         {dto.MetricType_GAUGE, nil},
		"idemstream_store_forgot":              {dto.MetricType_GAUGE, nil},
	}
	got := registered(t)
	for name, w := range want {
		m, ok := got[name]
		if !ok {
			t.Errorf("documented metric %s is not registered by consumer.NewMetrics", name)
			continue
		}
		if m.Type != w.typ {
			t.Errorf("%s: type %v, the documentation wants %v", name, m.Type, w.typ)
		}
		if !reflect.DeepEqual(m.Labels, w.labels) {
			t.Errorf("%s: labels %v, the documentation wants %v", name, m.Labels, w.labels)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Logf("note: %s is registered but not in the documented metrics", name)
		}
	}
}
