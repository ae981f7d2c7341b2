package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/razorbill/flo/libs/config"
)

// securityOpts turns conn's TLS and SASL settings into client options,
// refusing settings that cannot work.
func securityOpts(conn config.Kafka) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if conn.TLS || conn.TLSCAFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if conn.TLSCAFile != "" {
			pem, err := os.ReadFile(conn.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("read FLO_KAFKA_TLS_CA: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("FLO_KAFKA_TLS_CA %s holds no PEM certificate", conn.TLSCAFile)
			}
		}
		// franz-go sets each broker's host as the ServerName it verifies.
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	mech, err := saslMechanism(conn)
	if err != nil {
		return nil, err
	}
	if mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}

func saslMechanism(conn config.Kafka) (sasl.Mechanism, error) {
	if conn.SASLMechanism == "" {
		if conn.SASLUser != "" || conn.SASLPassword != "" {
			return nil, errors.New("FLO_KAFKA_SASL_USER and FLO_KAFKA_SASL_PASSWORD need FLO_KAFKA_SASL_MECHANISM (SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN)")
		}
		return nil, nil
	}
	if conn.SASLUser == "" || conn.SASLPassword == "" {
		return nil, fmt.Errorf("FLO_KAFKA_SASL_MECHANISM %s needs both FLO_KAFKA_SASL_USER and FLO_KAFKA_SASL_PASSWORD", conn.SASLMechanism)
	}
	switch conn.SASLMechanism {
	case "SCRAM-SHA-256":
		return scram.Auth{User: conn.SASLUser, Pass: conn.SASLPassword}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: conn.SASLUser, Pass: conn.SASLPassword}.AsSha512Mechanism(), nil
	case "PLAIN":
		return plain.Auth{User: conn.SASLUser, Pass: conn.SASLPassword}.AsMechanism(), nil
	}
	return nil, fmt.Errorf("FLO_KAFKA_SASL_MECHANISM %q is not SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN", conn.SASLMechanism)
}
