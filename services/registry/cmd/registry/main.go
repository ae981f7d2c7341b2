// Command registry runs Flo's registry service: worker registration,
// heartbeats, drain and health. Configuration comes from FLO_* and OTEL_*
// environment variables; `registry migrate` applies its schema and exits (see
// libs/cmdline for the commands).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/services/registry/migrations"
	"github.com/razorbill/flo/services/registry/service"
)

func main() {
	cmdline.Main("registry", service.Schema, migrations.FS, start)
}

func start(ctx context.Context, cfg service.Config, log *slog.Logger, metrics http.Handler) (cmdline.Server, error) {
	return service.New(ctx, cfg, log, service.WithMetricsHandler(metrics))
}
