// Command streams runs Flo's streams service: streams stored in log topics
// and their consumer groups. Configuration comes from FLO_* and OTEL_*
// environment variables; `streams migrate` applies its schema and exits (see
// libs/cmdline for the commands).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/services/streams/migrations"
	"github.com/razorbill/flo/services/streams/service"
)

func main() {
	cmdline.Main("streams", service.Schema, migrations.FS, start)
}

func start(ctx context.Context, cfg service.Config, log *slog.Logger, metrics http.Handler) (cmdline.Server, error) {
	return service.New(ctx, cfg, log, service.WithMetricsHandler(metrics))
}
