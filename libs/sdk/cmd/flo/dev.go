package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/razorbill/flo/libs/cmdline"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/logging"
	"github.com/razorbill/flo/services/devstack"
)

// newDevCmd runs the whole platform in the foreground, for a laptop.
func newDevCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole platform in the foreground (embedded broker and Postgres unless configured)",
		Long: `Runs the broker, Postgres and every service in this process.

With no FLO_KAFKA_BROKERS an embedded Kafka-protocol broker listens on 127.0.0.1:9092; with no
FLO_DATABASE_URL a private Postgres from the local installation listens on 127.0.0.1:5433.
Both keep their data under --data-dir (default .flo), so a restart finds everything again.
The gateway listens on 127.0.0.1:9000 (gRPC) and 127.0.0.1:8080 (REST) unless
FLO_GATEWAY_GRPC_ADDR / FLO_GATEWAY_HTTP_ADDR say otherwise, and every call needs a key:
the admin key is FLO_ADMIN_TOKEN, else the one kept in <data-dir>/admin-token (made on first
start). Ctrl-C stops everything cleanly.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runDev(ctx, cmd.OutOrStdout(), dataDir, cmd.Flags().Changed("data-dir"))
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", ".flo", "where the embedded broker and Postgres keep their data (FLO_DATA_DIR)")
	return cmd
}

func runDev(ctx context.Context, out io.Writer, dataDir string, dataDirSet bool) error {
	var cfg devstack.Config
	if err := config.Load(ctx, &cfg); err != nil {
		return fmt.Errorf("load configuration: %w", err)
	}
	if dataDirSet {
		cfg.DataDir = dataDir
	}
	var logCfg config.Log
	if err := config.Load(ctx, &logCfg); err != nil {
		return fmt.Errorf("load configuration: %w", err)
	}
	log, err := logging.New(os.Stderr, logCfg.Level, "flo-dev")
	if err != nil {
		return fmt.Errorf("logger: %w", err)
	}
	// The whole platform runs in this process: tune the collector as the
	// service binaries do, each with its own headroom.
	cmdline.TuneGC(log, cmdline.AllServices)
	stack, err := devstack.Start(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer stack.Stop()
	fmt.Fprintf(out, `Flo is running.
  gRPC (clients, workers)  %s
  REST                     http://%s/v1/...
  OpenAPI                  http://%s/openapi.json
  health                   http://%s/readyz
  metrics                  http://%s/metrics
  Kafka-protocol broker    %v
  Postgres                 %s
  admin key                %s

Clients and the CLI take the key from FLO_TOKEN:
  export FLO_TOKEN=%s
Press ctrl-C to stop.
`, stack.GatewayGRPCAddr(), stack.GatewayHTTPAddr(), stack.GatewayHTTPAddr(), stack.GatewayHTTPAddr(),
		stack.GatewayMetricsAddr(), stack.KafkaBrokers(), redactPassword(stack.DatabaseURL()), stack.AdminToken(), stack.AdminToken())
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "stopping...")
		return nil
	case <-stack.Done():
		return fmt.Errorf("a service stopped unexpectedly; see the log above")
	}
}

// redactPassword hides a password in a database URL before it is printed.
func redactPassword(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
