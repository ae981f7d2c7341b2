// Command gateway runs Flo's public edge: the gRPC API and worker streams on
// FLO_GATEWAY_GRPC_ADDR, the REST facade with /openapi.json, /healthz and
// /readyz on FLO_GATEWAY_HTTP_ADDR, and /metrics (with the probes) on
// FLO_GATEWAY_METRICS_ADDR. The gateway keeps no state,
// so `gateway migrate` has nothing to do (see libs/cmdline for the commands).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/services/gateway/service"
)

func main() {
	cmdline.Main("gateway", "", nil, start)
}

func start(ctx context.Context, cfg service.Config, log *slog.Logger, metrics http.Handler) (cmdline.Server, error) {
	return service.New(ctx, cfg, log, service.WithMetricsHandler(metrics))
}
