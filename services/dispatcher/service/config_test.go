package service_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/services/dispatcher/service"
)

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("FLO_DATABASE_URL", "postgres://db/flo")
	t.Setenv("FLO_KAFKA_BROKERS", "k1:9092,k2:9092")
	t.Setenv("FLO_INTERNAL_TOKEN", "internal-secret")
	t.Setenv("FLO_BOOTSTRAP_NAMESPACES", "default,payments")
	t.Setenv("FLO_DISPATCHER_ADVERTISE_ADDR", "10.0.0.7:9101")
	var cfg service.Config
	require.NoError(t, config.Load(t.Context(), &cfg))
	require.Equal(t, service.Config{
		GRPCAddr:               ":9101",
		HTTPAddr:               ":9111",
		BootstrapNamespaces:    []string{"default", "payments"},
		AdvertiseAddr:          "10.0.0.7:9101",
		MaxPayloadBytes:        config.DefaultMaxPayloadBytes,
		MaxActionsPerNamespace: 10000,
		PayloadMemory:          32 << 20,
		HotHorizon:             time.Minute,
		QueuedTasks:            20000,
		Postgres:               config.Postgres{URL: "postgres://db/flo", MaxConns: 16},
		Kafka:                  config.Kafka{Brokers: []string{"k1:9092", "k2:9092"}, Partitions: 8},
		Auth:                   config.Auth{Mode: "on", InternalToken: "internal-secret"},
	}, cfg)
}

func TestNewRejectsMissingSettings(t *testing.T) {
	t.Parallel()
	_, err := service.New(t.Context(), service.Config{Kafka: config.Kafka{Brokers: []string{"x"}}}, nil)
	require.ErrorContains(t, err, "FLO_DATABASE_URL")
	_, err = service.New(t.Context(), service.Config{Postgres: config.Postgres{URL: "postgres://x"}}, nil)
	require.ErrorContains(t, err, "FLO_KAFKA_BROKERS")
	_, err = service.New(t.Context(), service.Config{Postgres: config.Postgres{URL: "postgres://x"}, Kafka: config.Kafka{Brokers: []string{"x"}}}, nil)
	require.ErrorContains(t, err, "FLO_INTERNAL_TOKEN")
}

func TestConfigDefaults(t *testing.T) {
	t.Setenv("FLO_DATABASE_URL", "postgres://db/flo")
	t.Setenv("FLO_KAFKA_BROKERS", "k1:9092")
	var cfg service.Config
	require.NoError(t, config.Load(t.Context(), &cfg))
	require.Equal(t, []string{"default"}, cfg.BootstrapNamespaces)
	require.Empty(t, cfg.AdvertiseAddr, "the listener's address, resolved at start")
}
