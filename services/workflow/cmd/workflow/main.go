// Command workflow runs Flo's workflow service: YAML workflow definitions
// and their runs, signals, timers and history. Configuration comes from FLO_*
// and OTEL_* environment variables; `workflow migrate` applies its schema and
// exits (see libs/cmdline for the commands).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/services/workflow/migrations"
	"github.com/razorbill/flo/services/workflow/service"
)

func main() {
	cmdline.Main("workflow", service.Schema, migrations.FS, start)
}

func start(ctx context.Context, cfg service.Config, log *slog.Logger, metrics http.Handler) (cmdline.Server, error) {
	return service.New(ctx, cfg, log, service.WithMetricsHandler(metrics))
}
