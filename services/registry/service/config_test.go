package service_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/services/registry/service"
)

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("FLO_DATABASE_URL", "postgres://db/flo")
	t.Setenv("FLO_KAFKA_BROKERS", "k1:9092,k2:9092")
	t.Setenv("FLO_INTERNAL_TOKEN", "internal-secret")
	t.Setenv("FLO_REGISTRY_GRPC_ADDR", ":7000")
	t.Setenv("FLO_WORKER_HEARTBEAT_TIMEOUT", "2m")
	t.Setenv("FLO_WORKER_HEALTH_CHECK_INTERVAL", "250ms")
	t.Setenv("FLO_MAX_WORKERS_PER_NAMESPACE", "50")
	var cfg service.Config
	require.NoError(t, config.Load(t.Context(), &cfg))
	require.Equal(t, service.Config{
		GRPCAddr:               ":7000",
		HTTPAddr:               ":9112",
		HeartbeatTimeout:       2 * time.Minute,
		HealthCheckInterval:    250 * time.Millisecond,
		MaxWorkersPerNamespace: 50,
		MaxPayloadBytes:        config.DefaultMaxPayloadBytes,
		Postgres:               config.Postgres{URL: "postgres://db/flo", MaxConns: 16},
		Kafka:                  config.Kafka{Brokers: []string{"k1:9092", "k2:9092"}, Partitions: 8},
		Auth:                   config.Auth{Mode: "on", InternalToken: "internal-secret"},
	}, cfg)
}

func TestConfigDefaults(t *testing.T) {
	t.Setenv("FLO_DATABASE_URL", "postgres://db/flo")
	t.Setenv("FLO_KAFKA_BROKERS", "k1:9092")
	var cfg service.Config
	require.NoError(t, config.Load(t.Context(), &cfg))
	require.Equal(t, ":9102", cfg.GRPCAddr)
	require.Equal(t, ":9112", cfg.HTTPAddr)
	require.Equal(t, 90*time.Second, cfg.HeartbeatTimeout)
	require.Equal(t, 5*time.Second, cfg.HealthCheckInterval)
	require.Equal(t, 10000, cfg.MaxWorkersPerNamespace)
}

func TestNewRejectsBadSettings(t *testing.T) {
	t.Parallel()
	good := service.Config{
		HeartbeatTimeout: time.Second, HealthCheckInterval: time.Second, MaxWorkersPerNamespace: 1,
		Postgres: config.Postgres{URL: "postgres://x"}, Kafka: config.Kafka{Brokers: []string{"x"}},
		Auth: harness.InternalAuth(),
	}
	for _, tt := range []struct {
		name   string
		adjust func(*service.Config)
		want   string
	}{
		{"no database", func(c *service.Config) { c.Postgres.URL = "" }, "FLO_DATABASE_URL"},
		{"no brokers", func(c *service.Config) { c.Kafka.Brokers = nil }, "FLO_KAFKA_BROKERS"},
		{"zero timeout", func(c *service.Config) { c.HeartbeatTimeout = 0 }, "FLO_WORKER_HEARTBEAT_TIMEOUT"},
		{"zero interval", func(c *service.Config) { c.HealthCheckInterval = 0 }, "FLO_WORKER_HEALTH_CHECK_INTERVAL"},
		{"zero limit", func(c *service.Config) { c.MaxWorkersPerNamespace = 0 }, "FLO_MAX_WORKERS_PER_NAMESPACE"},
		{"no internal token", func(c *service.Config) { c.Auth = config.Auth{} }, "FLO_INTERNAL_TOKEN"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good
			tt.adjust(&cfg)
			_, err := service.New(t.Context(), cfg, nil)
			require.ErrorContains(t, err, tt.want)
		})
	}
}
