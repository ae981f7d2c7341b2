// Package config loads service configuration from the environment (FLO_* and
// the standard OTEL_* variables) and holds the settings services share.
package config

import (
	"context"
	"fmt"
	"time"

	"github.com/sethvargo/go-envconfig"
)

// Load fills the struct pointed to by cfg from environment variables named in
// its github.com/sethvargo/go-envconfig tags (`env:"FLO_X, default=..."`),
// including nested structs such as Postgres and Kafka.
//
// Slices are comma-separated by default. Do not write `delimiter=,` in a tag:
// the comma ends the option, and after `default=` everything up to the end of
// the tag (", delimiter=," included) becomes part of the default value.
func Load(ctx context.Context, cfg any) error {
	if err := envconfig.Process(ctx, cfg); err != nil {
		return fmt.Errorf("load config: %w", err)
	}
	return nil
}

// Postgres is the shared database setting. An empty URL means "start a
// private Postgres" in dev.
type Postgres struct {
	URL      string `env:"FLO_DATABASE_URL"`
	MaxConns int32  `env:"FLO_DATABASE_MAX_CONNS, default=16"`
}

// Kafka is the shared broker setting. No brokers means "run an embedded
// broker" in dev. FLO_KAFKA_BROKERS is comma-separated.
type Kafka struct {
	Brokers    []string `env:"FLO_KAFKA_BROKERS"`
	Partitions int32    `env:"FLO_KAFKA_PARTITIONS, default=8"`
	// TLS connects to the brokers over TLS, verified against TLSCAFile or,
	// when it is empty, the system's roots. A TLSCAFile turns TLS on.
	TLS       bool   `env:"FLO_KAFKA_TLS"`
	TLSCAFile string `env:"FLO_KAFKA_TLS_CA"`
	// SASLMechanism is SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN, with
	// SASLUser and SASLPassword; empty means no SASL.
	SASLMechanism string `env:"FLO_KAFKA_SASL_MECHANISM"`
	SASLUser      string `env:"FLO_KAFKA_SASL_USER"`
	SASLPassword  string `env:"FLO_KAFKA_SASL_PASSWORD"`
}

// DefaultMaxPayloadBytes is the default of FLO_MAX_PAYLOAD_BYTES, the
// platform's payload limit, for a service whose config was built in code
// with the limit left zero.
const DefaultMaxPayloadBytes = 1 << 20

// Log is the shared logging setting.
type Log struct {
	Level string `env:"FLO_LOG_LEVEL, default=info"`
}

// Shutdown is the shared stopping setting.
type Shutdown struct {
	// Delay is how long a stopping service keeps serving with /readyz
	// failing before it stops taking work, so that load balancers and
	// Kubernetes endpoints stop sending it requests first. Zero suits a
	// laptop; behind a load balancer a few seconds do.
	Delay time.Duration `env:"FLO_SHUTDOWN_DELAY, default=0s"`
}

// Auth says whether calls are authenticated, and how the services
// authenticate each other on their internal gRPC ports.
type Auth struct {
	// Mode is "on" (the default, also when a config is built in code) or
	// "off". Only FLO_AUTH=off turns authentication off.
	Mode string `env:"FLO_AUTH, default=on"`
	// InternalToken is the shared secret every internal gRPC call carries
	// and every internal server checks. Required unless Mode is "off".
	InternalToken string `env:"FLO_INTERNAL_TOKEN"`
	// InternalCertFile, InternalKeyFile and InternalCAFile, when set, put
	// internal gRPC on mutual TLS: servers and clients present the
	// certificate and verify the other side against the cluster CA.
	InternalCertFile string `env:"FLO_INTERNAL_TLS_CERT"`
	InternalKeyFile  string `env:"FLO_INTERNAL_TLS_KEY"`
	InternalCAFile   string `env:"FLO_INTERNAL_TLS_CA"`
}

// Off reports whether authentication was turned off on purpose.
func (a Auth) Off() bool { return a.Mode == "off" }
