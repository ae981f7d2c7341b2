package config_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
)

type serviceConfig struct {
	Addr     string        `env:"FLO_TEST_ADDR, default=:9000"`
	Interval time.Duration `env:"FLO_TEST_INTERVAL, default=1s"`
	Names    []string      `env:"FLO_TEST_NAMES, default=default"`
	Postgres config.Postgres
	Kafka    config.Kafka
	Log      config.Log
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want serviceConfig
	}{
		{
			name: "defaults",
			want: serviceConfig{
				Addr: ":9000", Interval: time.Second, Names: []string{"default"},
				Postgres: config.Postgres{MaxConns: 16},
				Kafka:    config.Kafka{Partitions: 8},
				Log:      config.Log{Level: "info"},
			},
		},
		{
			name: "from environment",
			env: map[string]string{
				"FLO_TEST_ADDR":            "127.0.0.1:1",
				"FLO_TEST_INTERVAL":        "250ms",
				"FLO_TEST_NAMES":           "a,b",
				"FLO_DATABASE_URL":         "postgres://db/x",
				"FLO_DATABASE_MAX_CONNS":   "4",
				"FLO_KAFKA_BROKERS":        "k1:9092,k2:9092",
				"FLO_KAFKA_PARTITIONS":     "3",
				"FLO_KAFKA_TLS":            "true",
				"FLO_KAFKA_TLS_CA":         "/etc/flo/kafka-ca.pem",
				"FLO_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
				"FLO_KAFKA_SASL_USER":      "flo",
				"FLO_KAFKA_SASL_PASSWORD":  "secret",
				"FLO_LOG_LEVEL":            "debug",
			},
			want: serviceConfig{
				Addr: "127.0.0.1:1", Interval: 250 * time.Millisecond, Names: []string{"a", "b"},
				Postgres: config.Postgres{URL: "postgres://db/x", MaxConns: 4},
				Kafka: config.Kafka{
					Brokers: []string{"k1:9092", "k2:9092"}, Partitions: 3, TLS: true, TLSCAFile: "/etc/flo/kafka-ca.pem",
					SASLMechanism: "SCRAM-SHA-512", SASLUser: "flo", SASLPassword: "secret",
				},
				Log: config.Log{Level: "debug"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var got serviceConfig
			require.NoError(t, config.Load(context.Background(), &got))
			require.Equal(t, tt.want, got)
		})
	}
}

func TestLoadRejectsBadValue(t *testing.T) {
	t.Setenv("FLO_KAFKA_PARTITIONS", "many")
	var cfg serviceConfig
	require.ErrorContains(t, config.Load(context.Background(), &cfg), "Partitions")
}
