package devstack

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/config"
)

// An existing broker that wants TLS and SASL is reachable from flo dev: the
// stack reads the same FLO_KAFKA_* settings as the services, and every
// service gets them.
func TestConfigTakesTheBrokersSecuritySettings(t *testing.T) {
	t.Setenv("FLO_KAFKA_BROKERS", "broker-0:9093,broker-1:9093")
	t.Setenv("FLO_KAFKA_TLS", "true")
	t.Setenv("FLO_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
	t.Setenv("FLO_KAFKA_SASL_USER", "flo")
	t.Setenv("FLO_KAFKA_SASL_PASSWORD", "secret")
	var cfg Config
	require.NoError(t, config.Load(t.Context(), &cfg))
	require.Equal(t, config.Kafka{
		Brokers: []string{"broker-0:9093", "broker-1:9093"}, Partitions: 8,
		TLS: true, SASLMechanism: "SCRAM-SHA-512", SASLUser: "flo", SASLPassword: "secret",
	}, cfg.Kafka)
}
