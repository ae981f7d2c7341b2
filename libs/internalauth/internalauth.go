// Package internalauth authenticates the calls between Flo's services on
// their internal gRPC ports: every call carries the cluster's shared internal
// token in the "x-flo-internal" metadata, checked in constant time, and with
// the internal TLS files set both sides speak mutual TLS against the cluster
// CA. The gateway and the services dial with DialOptions; the internal
// servers take ServerOptions.
package internalauth

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/certs"
	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/proto/codec"
)

// MetadataKey is the gRPC metadata key that carries the internal token.
const MetadataKey = "x-flo-internal"

// Validate reports a setting that cannot work: an unknown FLO_AUTH, an empty
// internal token while auth is on, or only some of the internal TLS files.
func Validate(a config.Auth) error {
	switch a.Mode {
	case "", "on", "off":
	default:
		return fmt.Errorf("FLO_AUTH is %q: want on or off", a.Mode)
	}
	if !a.Off() && a.InternalToken == "" {
		return errors.New("FLO_INTERNAL_TOKEN is empty: set the cluster's internal token (the same on every service), or FLO_AUTH=off to run without authentication")
	}
	set := 0
	for _, f := range []string{a.InternalCertFile, a.InternalKeyFile, a.InternalCAFile} {
		if f != "" {
			set++
		}
	}
	if set != 0 && set != 3 {
		return errors.New("FLO_INTERNAL_TLS_CERT, FLO_INTERNAL_TLS_KEY and FLO_INTERNAL_TLS_CA must be set together or not at all")
	}
	return nil
}

// ServerOptions returns what an internal gRPC server needs to refuse calls
// without the internal token (UNAUTHENTICATED) and, with the TLS files set,
// connections without a client certificate signed by the cluster CA. With
// auth off it checks no token but still speaks TLS when the files are set.
func ServerOptions(a config.Auth, log *slog.Logger) ([]grpc.ServerOption, error) {
	if err := Validate(a); err != nil {
		return nil, err
	}
	var opts []grpc.ServerOption
	if usesTLS(a) {
		cfg, err := certs.MutualServer(a.InternalCertFile, a.InternalKeyFile, a.InternalCAFile, log)
		if err != nil {
			return nil, fmt.Errorf("internal TLS: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg)))
	}
	if !a.Off() {
		want := []byte(a.InternalToken)
		opts = append(opts,
			grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				if err := check(ctx, want); err != nil {
					return nil, err
				}
				return handler(ctx, req)
			}),
			grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
				if err := check(ss.Context(), want); err != nil {
					return err
				}
				return handler(srv, ss)
			}),
		)
	}
	return opts, nil
}

// DialOptions returns the transport credentials and the per-call token an
// internal client needs: TLS presenting the service's certificate and
// verifying the server against the cluster CA when the files are set,
// plaintext otherwise. It also asks the resolver for no service config, as
// the SDK does: for a host name gRPC would otherwise look up a TXT record
// (_grpc_config.<host>), which /etc/hosts cannot answer, before the first
// connection, and a nameserver that drops it holds the start for 5-10 s.
// Calls are encoded with codec.Fast, as the internal servers decode them.
func DialOptions(a config.Auth, log *slog.Logger) ([]grpc.DialOption, error) {
	if err := Validate(a); err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if usesTLS(a) {
		cfg, err := certs.MutualClient(a.InternalCertFile, a.InternalKeyFile, a.InternalCAFile, log)
		if err != nil {
			return nil, fmt.Errorf("internal TLS: %w", err)
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds), grpc.WithDisableServiceConfig(),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec.Fast)),
	}
	if !a.Off() {
		opts = append(opts, grpc.WithPerRPCCredentials(token{value: a.InternalToken, secure: usesTLS(a)}))
	}
	return opts, nil
}

func check(ctx context.Context, want []byte) error {
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get(MetadataKey)
	if len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), want) != 1 {
		return status.Error(codes.Unauthenticated, "internal call without a valid internal credential")
	}
	return nil
}

func usesTLS(a config.Auth) bool { return a.InternalCertFile != "" }

// token is the internal token as per-call credentials.
type token struct {
	value  string
	secure bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (t token) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{MetadataKey: t.value}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials: the
// token travels over plaintext only when no TLS files are set, a cluster
// whose network is trusted instead.
func (t token) RequireTransportSecurity() bool { return t.secure }
