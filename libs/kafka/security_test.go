package kafka_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
)

// secureBroker runs a kfake broker that speaks only TLS (a certificate of a
// CA made for the test) and SASL, with one user per mechanism, and returns
// a connection setting without credentials.
func secureBroker(t *testing.T) config.Kafka {
	t.Helper()
	ca := harness.NewCA(t)
	certFile, keyFile := ca.Issue(t)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	cluster, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.AllowAutoTopicCreation(),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "flo-256", "secret-256"),
		kfake.Superuser("SCRAM-SHA-512", "flo-512", "secret-512"),
		kfake.Superuser("PLAIN", "flo-plain", "secret-plain"),
	)
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	return config.Kafka{Brokers: cluster.ListenAddrs(), Partitions: 1, TLSCAFile: ca.File}
}

func TestBrokerOverTLSAndSASL(t *testing.T) {
	t.Parallel()
	broker := secureBroker(t)
	for _, tt := range []struct{ mechanism, user, pass string }{
		{"SCRAM-SHA-256", "flo-256", "secret-256"},
		{"SCRAM-SHA-512", "flo-512", "secret-512"},
		{"PLAIN", "flo-plain", "secret-plain"},
	} {
		t.Run(tt.mechanism, func(t *testing.T) {
			t.Parallel()
			conn := broker
			conn.SASLMechanism, conn.SASLUser, conn.SASLPassword = tt.mechanism, tt.user, tt.pass
			topic := "secure-" + tt.user
			prod, err := kafka.NewProducer(t.Context(), conn, 1, config.DefaultMaxPayloadBytes, []string{topic})
			require.NoError(t, err)
			t.Cleanup(prod.Close)
			produce(t, prod, topic, "a", "b")

			col := &collector{}
			c, err := kafka.NewConsumer(conn, "g-"+tt.user, []string{topic}, col.handle, quiet)
			require.NoError(t, err)
			run(t, c.Run)
			require.Eventually(t, func() bool { return len(col.got()) == 2 }, 20*time.Second, 10*time.Millisecond)
			require.Equal(t, []string{"a", "b"}, col.got())
		})
	}
}

func TestBrokerRefusesWrongCredentials(t *testing.T) {
	t.Parallel()
	broker := secureBroker(t)
	for _, tt := range []struct {
		name   string
		adjust func(*config.Kafka)
		// want is in the error: the broker drops a connection whose SASL
		// exchange failed (EOF), and franz-go names a missing TLS or SASL.
		want string
	}{
		{"wrong password", func(c *config.Kafka) {
			c.SASLMechanism, c.SASLUser, c.SASLPassword = "SCRAM-SHA-256", "flo-256", "guess"
		}, "EOF"},
		{"unknown user", func(c *config.Kafka) {
			c.SASLMechanism, c.SASLUser, c.SASLPassword = "SCRAM-SHA-512", "someone", "secret-512"
		}, "EOF"},
		{"another mechanism's user", func(c *config.Kafka) {
			c.SASLMechanism, c.SASLUser, c.SASLPassword = "SCRAM-SHA-256", "flo-512", "secret-512"
		}, "EOF"},
		{"no SASL", func(*config.Kafka) {}, "is SASL missing"},
		{"no TLS", func(c *config.Kafka) {
			c.TLSCAFile = ""
			c.SASLMechanism, c.SASLUser, c.SASLPassword = "SCRAM-SHA-256", "flo-256", "secret-256"
		}, "is TLS missing"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := broker
			tt.adjust(&conn)
			cl, err := kafka.NewClient(conn)
			require.NoError(t, err)
			t.Cleanup(cl.Close)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			require.ErrorContains(t, cl.Ping(ctx), tt.want)
		})
	}
}

func TestBrokerSettingsAreChecked(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		conn config.Kafka
		want string
	}{
		{"unknown mechanism", config.Kafka{SASLMechanism: "GSSAPI", SASLUser: "u", SASLPassword: "p"}, "is not SCRAM-SHA-256"},
		{"user without password", config.Kafka{SASLMechanism: "SCRAM-SHA-256", SASLUser: "u"}, "FLO_KAFKA_SASL_PASSWORD"},
		{"password without user", config.Kafka{SASLMechanism: "PLAIN", SASLPassword: "p"}, "FLO_KAFKA_SASL_USER"},
		{"user without mechanism", config.Kafka{SASLUser: "u", SASLPassword: "p"}, "need FLO_KAFKA_SASL_MECHANISM"},
		{"missing CA file", config.Kafka{TLSCAFile: "/nonexistent/ca.pem"}, "FLO_KAFKA_TLS_CA"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.conn.Brokers = []string{"127.0.0.1:1"}
			_, err := kafka.NewClient(tt.conn)
			require.ErrorContains(t, err, tt.want)
		})
	}
}
