// Command dispatcher runs Flo's dispatcher service: actions, task queues,
// leases, retries and dead letters. Configuration comes from FLO_* and OTEL_*
// environment variables; `dispatcher migrate` applies its schema and exits (see
// libs/cmdline for the commands), and `dispatcher repartition N` raises the
// task topics' partition count (docs/design/dispatch.md).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/services/dispatcher/migrations"
	"github.com/razorbill/flo/services/dispatcher/service"
)

func main() {
	cmdline.Main("dispatcher", service.Schema, migrations.FS, start, service.RepartitionCommand())
}

func start(ctx context.Context, cfg service.Config, log *slog.Logger, metrics http.Handler) (cmdline.Server, error) {
	return service.New(ctx, cfg, log, service.WithMetricsHandler(metrics))
}
