// Package probe serves the probes every internal Flo service answers on its
// HTTP port: /healthz (the process is up), /readyz (it can do its work) and,
// when the process has telemetry, /metrics.
package probe

import (
	"context"
	"net/http"
)

// Handler answers GET /healthz with 200 "ok" while the process serves HTTP,
// and GET /readyz with 200 "ok" when ready returns nil, else 503 with the
// reason. metrics, when not nil, is served at GET /metrics.
func Handler(ready func(context.Context) error, metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	return mux
}
