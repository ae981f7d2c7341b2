package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/devstack"

	"github.com/razorbill/flo/libs/harness"
)

// bearerNamespaces answers ListNamespaces and keeps the authorization header of each call.
type bearerNamespaces struct {
	flov1.UnimplementedNamespaceServiceServer
	mu      sync.Mutex
	bearers []string
}

func (b *bearerNamespaces) ListNamespaces(ctx context.Context, _ *flov1.ListNamespacesRequest) (*flov1.ListNamespacesResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.bearers = append(b.bearers, md.Get("authorization")...)
	return &flov1.ListNamespacesResponse{Namespaces: []*flov1.Namespace{{Name: "myapp"}}}, nil
}

func (b *bearerNamespaces) last() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bearers[len(b.bearers)-1]
}

// serveTLS serves b over TLS with a certificate of ca for 127.0.0.1.
func serveTLS(t *testing.T, ca *harness.CA, b *bearerNamespaces) string {
	t.Helper()
	certFile, keyFile := ca.Issue(t)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	flov1.RegisterNamespaceServiceServer(srv, b)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestCAFileAndToken checks that the CLI and the SDK speak TLS verified against the CA file
// given by flag, option or FLO_CA_FILE, refuse a gateway certified by another CA, and send the
// key given by --token or FLO_TOKEN.
func TestCAFileAndToken(t *testing.T) {
	ca := harness.NewCA(t)
	b := &bearerNamespaces{}
	addr := serveTLS(t, ca, b)
	t.Setenv("FLO_CA_FILE", "")
	t.Setenv("FLO_TOKEN", "flo_from_env")

	code, _, stderr := runCLI(t, "--addr", addr, "namespace", "list")
	require.Equal(t, 1, code, "plaintext to a TLS gateway fails")
	require.NotEmpty(t, stderr)

	code, stdout, stderr := runCLI(t, "--addr", addr, "--ca-file", ca.File, "namespace", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `"myapp"`)
	require.Equal(t, "Bearer flo_from_env", b.last())

	code, _, stderr = runCLI(t, "--addr", addr, "--ca-file", ca.File, "--token", "flo_from_flag", "namespace", "list")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "Bearer flo_from_flag", b.last())

	code, _, stderr = runCLI(t, "--addr", addr, "--ca-file", harness.NewCA(t).File, "namespace", "list")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "certificate")

	t.Setenv("FLO_CA_FILE", ca.File)
	code, _, stderr = runCLI(t, "--addr", addr, "namespace", "list")
	require.Equal(t, 0, code, stderr)

	// The SDK alone: FLO_CA_FILE and FLO_TOKEN are its defaults too, and the options replace them.
	list := func(opts ...flo.ClientOption) error {
		c := flo.NewClient(addr, opts...)
		require.NoError(t, c.Connect())
		defer c.Close()
		_, err := c.ListNamespaces(t.Context())
		return err
	}
	require.NoError(t, list())
	require.Equal(t, "Bearer flo_from_env", b.last())
	require.NoError(t, list(flo.WithToken("flo_in_code")))
	require.Equal(t, "Bearer flo_in_code", b.last())
	pem, err := os.ReadFile(ca.File)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pem))
	require.NoError(t, list(flo.WithTLS(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})))
	require.ErrorContains(t, list(flo.WithCAFile(harness.NewCA(t).File)), "certificate")
}

// TestCLIOverTLSToTheGateway runs the CLI against the whole platform with TLS at the edge: with
// the CA file it registers and lists actions; without it, or with another CA, it is refused.
func TestCLIOverTLSToTheGateway(t *testing.T) {
	ca := harness.NewCA(t)
	stack, _ := startDevStack(t, func(cfg *devstack.Config) {
		cfg.GatewayTLSCert, cfg.GatewayTLSKey = ca.Issue(t)
	})
	addr := stack.GatewayGRPCAddr()

	code, _, stderr := runCLI(t, "--addr", addr, "--ca-file", ca.File, "-n", "myapp", "action", "register", "over-tls")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := runCLI(t, "--addr", addr, "--ca-file", ca.File, "-n", "myapp", "action", "list")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, `"over-tls"`)

	code, _, _ = runCLI(t, "--addr", addr, "-n", "myapp", "action", "list")
	require.Equal(t, 1, code, "plaintext to a TLS gateway is refused")
	code, _, _ = runCLI(t, "--addr", addr, "--ca-file", harness.NewCA(t).File, "-n", "myapp", "action", "list")
	require.Equal(t, 1, code, "a gateway certified by another CA is refused")
}
