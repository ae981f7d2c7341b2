// Command gateway runs Flo's public edge: the gRPC API and worker streams on
// FLO_GATEWAY_GRPC_ADDR, the REST facade with /openapi.json, /healthz,
// /readyz and /metrics on FLO_GATEWAY_HTTP_ADDR. The gateway keeps no state,
// so `gateway migrate` has nothing to do (see libs/cmdline for the commands).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/logging"
	"github.com/razorbill/flo/libs/telemetry"

	"github.com/razorbill/flo/services/gateway/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := cmdline.Run(ctx, os.Args[1:], os.Stdout, cmdline.Service{Name: "gateway", Serve: run}); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// env is everything the command reads from the environment.
type env struct {
	Gateway service.Config
	Log     config.Log
}

func run(ctx context.Context) (err error) {
	var cfg env
	if err := config.Load(ctx, &cfg); err != nil {
		return fmt.Errorf("load config: %w", err)
	}
	log, err := logging.New(os.Stdout, cfg.Log.Level, "gateway")
	if err != nil {
		return fmt.Errorf("set up logging: %w", err)
	}
	tel, err := telemetry.Setup(ctx, "gateway")
	if err != nil {
		return fmt.Errorf("set up telemetry: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		err = errors.Join(err, tel.Shutdown(sctx))
	}()
	svc, err := service.New(ctx, cfg.Gateway, log, service.WithMetricsHandler(tel.MetricsHandler()))
	if err != nil {
		return fmt.Errorf("start gateway: %w", err)
	}
	log.InfoContext(ctx, "gateway listening", "grpc", svc.GRPCAddr(), "http", svc.HTTPAddr(), "dispatcher", cfg.Gateway.DispatcherAddr)
	return svc.Run(ctx)
}
