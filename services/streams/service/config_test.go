package service_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/services/streams/service"
)

func TestConfigFromEnvironment(t *testing.T) {
	t.Setenv("FLO_DATABASE_URL", "postgres://db/flo")
	t.Setenv("FLO_KAFKA_BROKERS", "k1:9092,k2:9092")
	t.Setenv("FLO_INTERNAL_TOKEN", "internal-secret")
	t.Setenv("FLO_STREAMS_GRPC_ADDR", ":7000")
	t.Setenv("FLO_STREAMS_MAX_RECORD_BYTES", "2048")
	t.Setenv("FLO_STREAMS_READ_CACHE_BYTES", "0")
	var cfg service.Config
	require.NoError(t, config.Load(t.Context(), &cfg))
	require.Equal(t, service.Config{
		GRPCAddr:               ":7000",
		HTTPAddr:               ":9113",
		MaxRecordBytes:         2048,
		ReadCacheBytes:         0,
		MaxStreamsPerNamespace: 1000,
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
	require.Equal(t, ":9103", cfg.GRPCAddr)
	require.Equal(t, ":9113", cfg.HTTPAddr)
	require.Equal(t, 1<<20, cfg.MaxRecordBytes)
	require.Equal(t, int64(64<<20), cfg.ReadCacheBytes)
}

func TestNewRejectsBadSettings(t *testing.T) {
	t.Parallel()
	good := service.Config{
		MaxRecordBytes: 1024,
		Postgres:       config.Postgres{URL: "postgres://x"}, Kafka: config.Kafka{Brokers: []string{"x"}},
		Auth: harness.InternalAuth(),
	}
	for _, tt := range []struct {
		name   string
		adjust func(*service.Config)
		want   string
	}{
		{"no database", func(c *service.Config) { c.Postgres.URL = "" }, "FLO_DATABASE_URL"},
		{"no brokers", func(c *service.Config) { c.Kafka.Brokers = nil }, "FLO_KAFKA_BROKERS"},
		{"zero record size", func(c *service.Config) { c.MaxRecordBytes = 0 }, "FLO_STREAMS_MAX_RECORD_BYTES"},
		{"huge record size", func(c *service.Config) { c.MaxRecordBytes = 1 << 30 }, "FLO_STREAMS_MAX_RECORD_BYTES"},
		{"negative cache", func(c *service.Config) { c.ReadCacheBytes = -1 }, "FLO_STREAMS_READ_CACHE_BYTES"},
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

func TestProbes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start(t, e.config())
	get := func(path string) (int, string) { return harness.HTTPGet(t, "http://"+r.svc.HTTPAddr()+path) }
	code, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code, body)
	r.stop()
	_, err := http.Get("http://" + r.svc.HTTPAddr() + "/healthz")
	require.Error(t, err, "stopped")
}
