// Command workflow runs Flo's workflow service: YAML workflow definitions
// and their runs, signals, timers and history. Configuration comes from FLO_*
// and OTEL_* environment variables; `workflow migrate` applies its schema and
// exits (see libs/cmdline for the commands).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/logging"
	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/services/workflow/migrations"
	"github.com/razorbill/flo/services/workflow/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmdline.Run(ctx, os.Args[1:], os.Stdout, cmdline.Service{
		Name: "workflow", Serve: run, Schema: service.Schema, Migrations: migrations.FS,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	var (
		cfg    service.Config
		logCfg config.Log
	)
	if err := config.Load(ctx, &cfg); err != nil {
		return err
	}
	if err := config.Load(ctx, &logCfg); err != nil {
		return err
	}
	log, err := logging.New(os.Stdout, logCfg.Level, "workflow")
	if err != nil {
		return err
	}
	tel, err := telemetry.Setup(ctx, "workflow")
	if err != nil {
		return err
	}
	defer func() {
		if err := tel.Shutdown(context.WithoutCancel(ctx)); err != nil {
			log.Warn("flush telemetry", "error", err)
		}
	}()
	svc, err := service.New(ctx, cfg, log, service.WithMetricsHandler(tel.MetricsHandler()))
	if err != nil {
		return err
	}
	log.Info("workflow listening", "grpc", svc.GRPCAddr(), "http", svc.HTTPAddr())
	return svc.Run(ctx)
}
