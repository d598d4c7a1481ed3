package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The profiles are served only when metrics.pprof asks for them, on the
// metrics server's own handler, beside /metrics and /readyz.
func TestMetricsServerServesProfilesOnlyWhenAsked(t *testing.T) {
	ready := func(context.Context) []string { return nil }
	for _, profiles := range []bool{false, true} {
		srv := metricsServer(newRegistry(), ready, profiles)
		for path, want := range map[string]int{
			"/readyz":                   http.StatusOK,
			"/metrics":                  http.StatusOK,
			"/debug/pprof/":             http.StatusNotFound,
			"/debug/pprof/cmdline":      http.StatusNotFound,
			"/debug/pprof/heap?debug=1": http.StatusNotFound,
			"/debug/pprof/symbol":       http.StatusNotFound,
		} {
			if profiles && strings.HasPrefix(path, "/debug/pprof/") {
				want = http.StatusOK
			}
			rec := httptest.NewRecorder()
			srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if rec.Code != want {
				t.Errorf("pprof %v: GET %s answered %d, want %d", profiles, path, rec.Code, want)
			}
		}
	}
}
