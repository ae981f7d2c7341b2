package cmdline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
func Main[C any](name, schema string, migrations fs.FS, start Starter[C], commands ...Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, os.Args[1:], os.Stdout, Service{
		Name: name, Schema: schema, Migrations: migrations, Serve: serve(name, start), Commands: commands,
	})
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// Setup is what a service's own command (Command) starts with: its
// configuration C and log level loaded from the environment as serving
// loads them, and logging to stdout under name.
func Setup[C any](ctx context.Context, name string, stdout io.Writer) (C, *slog.Logger, error) {
	var env struct {
		Service C
		Log     config.Log
	}
	if err := config.Load(ctx, &env); err != nil {
		return env.Service, nil, fmt.Errorf("load config: %w", err)
	}
	log, err := logging.New(stdout, env.Log.Level, name)
	if err != nil {
		return env.Service, nil, fmt.Errorf("set up logging: %w", err)
	}
	return env.Service, log, nil
}

func serve[C any](name string, start Starter[C]) func(context.Context) error {
	return func(ctx context.Context) (err error) {
		cfg, log, err := Setup[C](ctx, name, os.Stdout)
		if err != nil {
			return err
		}
		var addr addrConfig
		if err := config.Load(ctx, &addr); err != nil {
			return fmt.Errorf("load config: %w", err)
		}
		TuneGC(log, 1)
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
		svc, err := start(ctx, cfg, log, tel.MetricsHandler())
		if err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		log.InfoContext(ctx, name+" listening", "grpc", svc.GRPCAddr(), "http", svc.HTTPAddr())
		if err := writeAddrs(addr.File, svc); err != nil {
			return err
		}
		return svc.Run(ctx)
	}
}

// addrConfig says where a service reports the addresses it listens on.
type addrConfig struct {
	// File, when set, is written with the service's addresses once it
	// listens, so whoever started it with port 0 (":0") learns the ports
	// the system picked rather than reserving one beforehand.
	File string `env:"FLO_ADDR_FILE"`
}

// Addrs is the content of FLO_ADDR_FILE, as JSON.
type Addrs struct {
	GRPC string `json:"grpc"`
	HTTP string `json:"http"`
}

// writeAddrs writes srv's addresses to path, when path is set. The file
// appears whole (written aside, then renamed), so a reader polling for it
// never sees half of it.
func writeAddrs(path string, srv Server) error {
	if path == "" {
		return nil
	}
	b, err := json.Marshal(Addrs{GRPC: srv.GRPCAddr(), HTTP: srv.HTTPAddr()})
	if err != nil {
		return fmt.Errorf("encode addresses: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write FLO_ADDR_FILE: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write FLO_ADDR_FILE: %w", err)
	}
	return nil
}

// ReadAddrs reads a file written through FLO_ADDR_FILE; the error wraps
// fs.ErrNotExist until the service has written it.
func ReadAddrs(path string) (Addrs, error) {
	var a Addrs
	b, err := os.ReadFile(path)
	if err != nil {
		return a, fmt.Errorf("read addresses: %w", err)
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("read addresses from %s: %w", path, err)
	}
	return a, nil
}
