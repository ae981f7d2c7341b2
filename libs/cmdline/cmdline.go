// Package cmdline runs the command line every Flo service binary shares, so
// each cmd/<service>/main.go only wires:
//
//	<service>                  serve until SIGINT/SIGTERM (the default)
//	<service> serve            the same
//	<service> migrate          apply the service's Postgres schema and exit
//	<service> healthcheck URL  exit 0 when GET URL answers 200
//	<service> help             print this usage
//
// and the service's own commands (Service.Commands).
//
// migrate exists for Kubernetes Jobs and compose steps that bring a schema up
// to date before a rollout (services also migrate at start, under an advisory
// lock, so the two never race). healthcheck exists because the images carry
// no shell or curl: a container health check runs the binary itself.
package cmdline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/logging"
	"github.com/razorbill/flo/libs/pg"
)

// ErrUsage is returned (wrapped) for a command line Run does not understand.
var ErrUsage = errors.New("usage")

// healthcheckTimeout bounds one health check request; container runtimes
// apply their own timeout too, but a hung connection must not outlive it.
const healthcheckTimeout = 3 * time.Second

// Service describes one service binary.
type Service struct {
	// Name is the service's name, used in usage text and logs.
	Name string
	// Serve runs the service until ctx ends.
	Serve func(ctx context.Context) error
	// Schema is the service's Postgres schema; empty means the service keeps
	// no state, and migrate says so and succeeds, so deploy tooling can treat
	// every service alike.
	Schema string
	// Migrations holds the service's goose migrations at its root.
	Migrations fs.FS
	// Commands are the service's own commands, beside the shared ones.
	Commands []Command
}

// Command is a command of one service's binary: `<service> Name args...`.
type Command struct {
	// Name names the command; Args and Help describe its arguments and
	// what it does in the usage text.
	Name, Args, Help string
	// Run runs it with the arguments after its name, writing to stdout.
	Run func(ctx context.Context, args []string, stdout io.Writer) error
}

// MigrateConfig is everything migrate reads from the environment.
type MigrateConfig struct {
	Postgres config.Postgres
	Log      config.Log
}

// Run parses args (os.Args[1:]) and runs the command they name, writing
// usage and logs to stdout.
func Run(ctx context.Context, args []string, stdout io.Writer, svc Service) error {
	cmd, rest := "serve", args
	if len(args) > 0 {
		cmd, rest = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		if len(rest) > 0 {
			return fmt.Errorf("%w: serve takes no arguments, got %q", ErrUsage, rest)
		}
		return svc.Serve(ctx)
	case "migrate":
		if len(rest) > 0 {
			return fmt.Errorf("%w: migrate takes no arguments, got %q", ErrUsage, rest)
		}
		return migrate(ctx, stdout, svc)
	case "healthcheck":
		if len(rest) != 1 {
			return fmt.Errorf("%w: healthcheck takes one URL, got %q", ErrUsage, rest)
		}
		return Healthcheck(ctx, rest[0])
	case "help", "-h", "-help", "--help":
		_, err := fmt.Fprint(stdout, usage(svc))
		return err
	}
	for _, c := range svc.Commands {
		if c.Name == cmd {
			return c.Run(ctx, rest, stdout)
		}
	}
	return fmt.Errorf("%w: unknown command %q\n%s", ErrUsage, cmd, usage(svc))
}

func usage(svc Service) string {
	var b strings.Builder
	fmt.Fprintf(&b, `usage:
  %[1]s                  serve (configuration from FLO_* and OTEL_* variables)
  %[1]s migrate          apply the %[1]s schema to FLO_DATABASE_URL and exit
  %[1]s healthcheck URL  exit 0 when GET URL answers 200
`, svc.Name)
	for _, c := range svc.Commands {
		fmt.Fprintf(&b, "  %-22s %s\n", svc.Name+" "+c.Name+" "+c.Args, c.Help)
	}
	return b.String()
}

// migrate applies svc's migrations under pg.Migrate's advisory lock. It
// waits for the database as a starting service does, so a Job started
// alongside Postgres succeeds once Postgres is up; the Job's deadline bounds
// the wait.
func migrate(ctx context.Context, stdout io.Writer, svc Service) error {
	var cfg MigrateConfig
	if err := config.Load(ctx, &cfg); err != nil {
		return err
	}
	log, err := logging.New(stdout, cfg.Log.Level, svc.Name)
	if err != nil {
		return fmt.Errorf("set up logging: %w", err)
	}
	if svc.Schema == "" {
		log.InfoContext(ctx, svc.Name+" keeps no database schema; nothing to migrate")
		return nil
	}
	if cfg.Postgres.URL == "" {
		return errors.New("migrate: FLO_DATABASE_URL is required")
	}
	pool, err := pg.Open(ctx, cfg.Postgres.URL, svc.Schema, 2, svc.Migrations, log)
	if err != nil {
		return fmt.Errorf("migrate %s: %w", svc.Schema, err)
	}
	pool.Close()
	log.InfoContext(ctx, "schema up to date", "schema", svc.Schema)
	return nil
}

// Healthcheck returns nil when GET url answers 200 within a few seconds.
func Healthcheck(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck %s: %s: %s", url, resp.Status, body)
	}
	return nil
}
