package harness

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/internalauth"
)

// internalToken is the internal token of configs built in test code.
const internalToken = "flo-test-internal-token"

// InternalAuth is the auth setting of a service config built in test code:
// auth on, with a fixed internal token every service and client of the test
// shares.
func InternalAuth() config.Auth {
	return config.Auth{Mode: "on", InternalToken: internalToken}
}

// DialInternal connects to a service's internal gRPC port with the
// credentials of InternalAuth, plus opts; the connection is closed when the
// test ends.
func DialInternal(tb testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	auth, err := internalauth.DialOptions(InternalAuth(), nil)
	if err != nil {
		tb.Fatalf("internal dial options: %v", err)
	}
	conn, err := grpc.NewClient(addr, append(auth, opts...)...)
	if err != nil {
		tb.Fatalf("dial %s: %v", addr, err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// RequireInternalAuth checks that the internal gRPC server at addr answers
// call UNAUTHENTICATED without the internal credential and with a wrong
// token, and serves it with InternalAuth's.
func RequireInternalAuth(tb testing.TB, addr string, call func(context.Context, *grpc.ClientConn) error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatalf("dial %s: %v", addr, err)
	}
	defer plain.Close()
	if code := status.Code(call(ctx, plain)); code != codes.Unauthenticated {
		tb.Errorf("a call without the internal token: %s, want Unauthenticated", code)
	}
	wrong := metadata.AppendToOutgoingContext(ctx, internalauth.MetadataKey, "not-"+internalToken)
	if code := status.Code(call(wrong, plain)); code != codes.Unauthenticated {
		tb.Errorf("a call with a wrong internal token: %s, want Unauthenticated", code)
	}
	if err := call(ctx, DialInternal(tb, addr)); err != nil {
		tb.Errorf("a call with the internal token: %v", err)
	}
}

// CA is a certificate authority made for one test, for tests of TLS.
type CA struct {
	// File is the PEM file of the CA's certificate.
	File string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	dir  string
}

// NewCA makes a CA whose files live in the test's temporary directory.
func NewCA(tb testing.TB) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: "flo test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("parse CA certificate: %v", err)
	}
	dir := tb.TempDir()
	file := filepath.Join(dir, "ca.pem")
	writePEM(tb, file, "CERTIFICATE", der)
	return &CA{File: file, cert: cert, key: key, dir: dir}
}

// Issue signs a certificate for 127.0.0.1, ::1 and localhost, usable by a
// server and by a client, and returns its PEM certificate and key files.
// Each call writes new files.
func (ca *CA) Issue(tb testing.TB) (certFile, keyFile string) {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("create certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatalf("marshal key: %v", err)
	}
	dir, err := os.MkdirTemp(ca.dir, "cert-")
	if err != nil {
		tb.Fatalf("certificate directory: %v", err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writePEM(tb, certFile, "CERTIFICATE", der)
	writePEM(tb, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("generate key: %v", err)
	}
	return key
}

func serial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		tb.Fatalf("serial number: %v", err)
	}
	return n
}

func writePEM(tb testing.TB, path, kind string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatalf("write %s: %v", path, err)
	}
}
