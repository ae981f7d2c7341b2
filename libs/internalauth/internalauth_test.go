package internalauth_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/internalauth"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		auth config.Auth
		err  string
	}{
		{name: "token", auth: config.Auth{InternalToken: "t"}},
		{name: "on with token", auth: config.Auth{Mode: "on", InternalToken: "t"}},
		{name: "off without token", auth: config.Auth{Mode: "off"}},
		{name: "no token", auth: config.Auth{Mode: "on"}, err: "FLO_INTERNAL_TOKEN"},
		{name: "unknown mode", auth: config.Auth{Mode: "yes", InternalToken: "t"}, err: "FLO_AUTH"},
		{name: "some TLS files", auth: config.Auth{InternalToken: "t", InternalCertFile: "c", InternalKeyFile: "k"}, err: "FLO_INTERNAL_TLS_CA"},
		{name: "all TLS files", auth: config.Auth{InternalToken: "t", InternalCertFile: "c", InternalKeyFile: "k", InternalCAFile: "ca"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := internalauth.Validate(tt.auth)
			if tt.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.err)
		})
	}
}

func TestServerOptionsRefuseAnInvalidSetting(t *testing.T) {
	t.Parallel()
	_, err := internalauth.ServerOptions(config.Auth{}, nil)
	require.ErrorContains(t, err, "FLO_INTERNAL_TOKEN")
	_, err = internalauth.DialOptions(config.Auth{}, nil)
	require.ErrorContains(t, err, "FLO_INTERNAL_TOKEN")
}

func TestToken(t *testing.T) {
	t.Parallel()
	auth := harness.InternalAuth()
	addr := serve(t, auth)
	plain := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	opts, err := internalauth.DialOptions(auth, nil)
	require.NoError(t, err)
	good := dial(t, addr, opts...)
	wrongOpts, err := internalauth.DialOptions(config.Auth{InternalToken: "not-the-token"}, nil)
	require.NoError(t, err)
	wrong := dial(t, addr, wrongOpts...)

	require.Equal(t, codes.Unauthenticated, checkCode(t, plain))
	require.Equal(t, codes.Unauthenticated, watchCode(t, plain))
	require.Equal(t, codes.Unauthenticated, checkCode(t, wrong))
	require.Equal(t, codes.Unauthenticated, watchCode(t, wrong))
	require.Equal(t, codes.OK, checkCode(t, good))
	require.Equal(t, codes.OK, watchCode(t, good))

	// The token repeated beside a wrong one is not the token.
	ctx := metadata.AppendToOutgoingContext(context.Background(), internalauth.MetadataKey, "not-the-token")
	_, err = healthpb.NewHealthClient(good).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err))
}

func TestOffChecksNoToken(t *testing.T) {
	t.Parallel()
	off := config.Auth{Mode: "off"}
	addr := serve(t, off)
	opts, err := internalauth.DialOptions(off, nil)
	require.NoError(t, err)
	require.Equal(t, codes.OK, checkCode(t, dial(t, addr, opts...)))
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca := harness.NewCA(t)
	server := tlsAuth(t, ca)
	addr := serve(t, server)

	opts, err := internalauth.DialOptions(tlsAuth(t, ca), nil)
	require.NoError(t, err)
	require.Equal(t, codes.OK, checkCode(t, dial(t, addr, opts...)), "a client with a certificate of the cluster CA")
	require.Equal(t, codes.OK, watchCode(t, dial(t, addr, opts...)))

	tokenOnly, err := internalauth.DialOptions(harness.InternalAuth(), nil)
	require.NoError(t, err)
	require.Equal(t, codes.Unavailable, checkCode(t, dial(t, addr, tokenOnly...)), "a plaintext client")

	pool := x509.NewCertPool()
	pem, err := os.ReadFile(ca.File)
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(pem))
	noCert := dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})))
	ctx := metadata.AppendToOutgoingContext(context.Background(), internalauth.MetadataKey, server.InternalToken)
	_, err = healthpb.NewHealthClient(noCert).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "a client without a certificate: %v", err)

	// A certificate of another CA, trusting the right server.
	other := tlsAuth(t, harness.NewCA(t))
	pair, err := tls.LoadX509KeyPair(other.InternalCertFile, other.InternalKeyFile)
	require.NoError(t, err)
	foreign := dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13,
	})))
	_, err = healthpb.NewHealthClient(foreign).Check(ctx, &healthpb.HealthCheckRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "a client with another CA's certificate: %v", err)

	// A server of another CA is refused by the client.
	otherOpts, err := internalauth.DialOptions(other, nil)
	require.NoError(t, err)
	require.Equal(t, codes.Unavailable, checkCode(t, dial(t, addr, otherOpts...)), "a server of another CA")
}

func tlsAuth(t *testing.T, ca *harness.CA) config.Auth {
	t.Helper()
	a := harness.InternalAuth()
	a.InternalCertFile, a.InternalKeyFile = ca.Issue(t)
	a.InternalCAFile = ca.File
	return a
}

// serve starts a gRPC server with the health service behind auth's options.
func serve(t *testing.T, auth config.Auth) string {
	t.Helper()
	opts, err := internalauth.ServerOptions(auth, nil)
	require.NoError(t, err)
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func checkCode(t *testing.T, conn *grpc.ClientConn) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return status.Code(err)
}

// watchCode opens the health Watch stream, a server stream, and returns the
// code of its first message.
func watchCode(t *testing.T, conn *grpc.ClientConn) codes.Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return status.Code(err)
	}
	_, err = stream.Recv()
	return status.Code(err)
}
