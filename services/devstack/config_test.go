package devstack_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/config"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/devstack"
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
	var cfg devstack.Config
	require.NoError(t, config.Load(t.Context(), &cfg))
	require.Equal(t, config.Kafka{
		Brokers: []string{"broker-0:9093", "broker-1:9093"}, Partitions: 8,
		TLS: true, SASLMechanism: "SCRAM-SHA-512", SASLUser: "flo", SASLPassword: "secret",
	}, cfg.Kafka)
}

// flo dev honours the services' own limits, set as for their binaries: the
// registry's, the dispatcher's and the streams service's are each in force.
func TestStackTakesTheServicesLimitsFromTheEnvironment(t *testing.T) {
	t.Setenv("FLO_MAX_WORKERS_PER_NAMESPACE", "3")
	t.Setenv("FLO_MAX_ACTIONS_PER_NAMESPACE", "2")
	t.Setenv("FLO_MAX_STREAMS_PER_NAMESPACE", "1")
	e := newEnv(t)
	ctx := t.Context()

	registry := flov1.NewWorkerRegistryServiceClient(dial(t, e.stack.GatewayGRPCAddr()))
	register := func(id string) error {
		_, err := registry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{
			Namespace: "default", WorkerId: id, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION,
		})
		return err
	}
	for _, id := range []string{"w1", "w2", "w3"} {
		require.NoError(t, register(id))
	}
	requireExhausted(t, register("w4"), "the fourth worker")

	client := e.client(t, "default")
	for _, name := range []string{"a1", "a2"} {
		_, err := client.RegisterAction(ctx, name, flo.ActionOptions{})
		require.NoError(t, err)
	}
	_, err := client.RegisterAction(ctx, "a3", flo.ActionOptions{})
	requireExhausted(t, err, "the third action")

	_, err = client.CreateStream(ctx, "s1", flo.StreamOptions{})
	require.NoError(t, err)
	_, err = client.CreateStream(ctx, "s2", flo.StreamOptions{})
	requireExhausted(t, err, "the second stream")
}

func requireExhausted(t *testing.T, err error, what string) {
	t.Helper()
	require.Error(t, err, what)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%s: %v", what, err)
}
