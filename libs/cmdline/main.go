package cmdline

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/logging"
	"github.com/razorbill/flo/libs/telemetry"
)

// telemetryFlushTimeout bounds the final export of spans and metrics, so an
// unreachable collector cannot hold a stopping pod past its grace period.
const telemetryFlushTimeout = 5 * time.Second

// Server is a service that has opened its listeners and serves until its
// context ends.
type Server interface {
	Run(ctx context.Context) error
	GRPCAddr() string
	HTTPAddr() string
}

// Starter builds a service from its configuration C (read from the
// environment), the process's logger and its /metrics handler.
type Starter[C any] func(ctx context.Context, cfg C, log *slog.Logger, metrics http.Handler) (Server, error)

// Main is the whole main function of a service binary: it runs the command
// os.Args names until SIGINT or SIGTERM and exits 1 with the error on
// failure. Serving loads C and the log level from the environment, sets up
// logging and telemetry under name, tunes the garbage collector (TuneGC) and
// runs what start returns.
func Main[C any](name, schema string, migrations fs.FS, start Starter[C]) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, os.Args[1:], os.Stdout, Service{
		Name: name, Schema: schema, Migrations: migrations, Serve: serve(name, start),
	})
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func serve[C any](name string, start Starter[C]) func(context.Context) error {
	return func(ctx context.Context) (err error) {
		var env struct {
			Service C
			Log     config.Log
		}
		if err := config.Load(ctx, &env); err != nil {
			return fmt.Errorf("load config: %w", err)
		}
		log, err := logging.New(os.Stdout, env.Log.Level, name)
		if err != nil {
			return fmt.Errorf("set up logging: %w", err)
		}
		TuneGC(log)
		tel, err := telemetry.Setup(ctx, name)
		if err != nil {
			return fmt.Errorf("set up telemetry: %w", err)
		}
		defer func() {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), telemetryFlushTimeout)
			defer cancel()
			if ferr := tel.Shutdown(fctx); ferr != nil {
				err = errors.Join(err, fmt.Errorf("flush telemetry: %w", ferr))
			}
		}()
		svc, err := start(ctx, env.Service, log, tel.MetricsHandler())
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		log.InfoContext(ctx, name+" listening", "grpc", svc.GRPCAddr(), "http", svc.HTTPAddr())
		return svc.Run(ctx)
	}
}
