package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newRegistry is a process's registry: the Go runtime's and the process's
// collectors, and what the command registers on it.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// metricsServer serves /metrics from reg, /healthz, and /readyz: ready
// when problems lists none, else 503 with one line per problem; with
// profiles (metrics.pprof), net/http/pprof's handlers under /debug/pprof/.
func metricsServer(reg *prometheus.Registry, problems func(ctx context.Context) []string, profiles bool) *http.Server {
	mux := http.NewServeMux()
	if profiles {
		// Registered on this mux only: importing net/http/pprof also
		// adds them to http.DefaultServeMux, which nothing here serves.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ps := problems(r.Context()); len(ps) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			for _, p := range ps {
				fmt.Fprintln(w, p)
			}
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}
