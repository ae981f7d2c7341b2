package certs_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/certs"
	"github.com/razorbill/flo/libs/harness"
)

// served copies a freshly issued pair to the paths the server reads, the way
// a rotation replaces them (a rename, as a Secret volume does), and returns
// the new certificate.
func served(t *testing.T, ca *harness.CA, certFile, keyFile string) *x509.Certificate {
	t.Helper()
	newCert, newKey := ca.Issue(t)
	require.NoError(t, os.Rename(newKey, keyFile))
	require.NoError(t, os.Rename(newCert, certFile))
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	return pair.Leaf
}

// handshake connects a client trusting caFile to a server with srv over
// loopback TCP and returns the certificate the client saw, or the client's
// handshake error.
func handshake(t *testing.T, srv *tls.Config, caFile string) (*x509.Certificate, error) {
	t.Helper()
	client, err := certs.Client(caFile)
	require.NoError(t, err)
	client.ServerName = "localhost"
	lis, err := tls.Listen("tcp", "127.0.0.1:0", srv)
	require.NoError(t, err)
	defer lis.Close()
	go func() {
		c, err := lis.Accept()
		if err != nil {
			return
		}
		_ = c.(*tls.Conn).Handshake()
		_ = c.Close()
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), client)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// servedSerial is the serial of the certificate a handshake with srv sees.
func servedSerial(t *testing.T, srv *tls.Config, caFile string) string {
	t.Helper()
	cert, err := handshake(t, srv, caFile)
	require.NoError(t, err)
	return cert.SerialNumber.String()
}

func TestServerServesThePairAClientOfTheCAVerifies(t *testing.T) {
	ca := harness.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	want := served(t, ca, certFile, keyFile)

	srv, err := certs.Server(certFile, keyFile, nil)
	require.NoError(t, err)
	require.Equal(t, want.SerialNumber.String(), servedSerial(t, srv, ca.File))

	// A client trusting another CA refuses the server.
	_, err = handshake(t, srv, harness.NewCA(t).File)
	require.Error(t, err)
}

func TestReloaderServesReplacedFilesAndKeepsThePairWhenTheNewOneIsBad(t *testing.T) {
	ca := harness.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := served(t, ca, certFile, keyFile)

	// Interval 0: every handshake looks at the files.
	srv, err := certs.ServerEvery(certFile, keyFile, 0)
	require.NoError(t, err)
	require.Equal(t, first.SerialNumber.String(), servedSerial(t, srv, ca.File))

	second := served(t, ca, certFile, keyFile)
	require.NotEqual(t, first.SerialNumber, second.SerialNumber)
	require.Equal(t, second.SerialNumber.String(), servedSerial(t, srv, ca.File))

	// A half-written certificate does not load: the last good pair stays.
	require.NoError(t, os.WriteFile(certFile, []byte("-----BEGIN CERTIFICATE-----\n"), 0o600))
	require.Equal(t, second.SerialNumber.String(), servedSerial(t, srv, ca.File))

	third := served(t, ca, certFile, keyFile)
	require.Equal(t, third.SerialNumber.String(), servedSerial(t, srv, ca.File))
}

func TestReloaderLooksAtTheFilesAtMostOncePerInterval(t *testing.T) {
	ca := harness.NewCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	first := served(t, ca, certFile, keyFile)

	srv, err := certs.ServerEvery(certFile, keyFile, time.Hour)
	require.NoError(t, err)
	served(t, ca, certFile, keyFile)
	pair, err := srv.GetCertificate(nil)
	require.NoError(t, err)
	require.Equal(t, first.SerialNumber, pair.Leaf.SerialNumber)
}

func TestServerAndClientRefuseMissingFiles(t *testing.T) {
	dir := t.TempDir()
	_, err := certs.Server(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), nil)
	require.Error(t, err)
	_, err = certs.Server("", "", nil)
	require.Error(t, err)
	_, err = certs.Client(filepath.Join(dir, "ca.pem"))
	require.Error(t, err)
	_, err = certs.MutualServer(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.pem"), nil)
	require.Error(t, err)
	empty := filepath.Join(dir, "empty.pem")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	_, err = certs.Client(empty)
	require.Error(t, err)
}

// Both sides of mutual TLS present their pairs and check the other's against the CA: a client
// without a certificate, or with one of another CA, is refused.
func TestMutualServerAndClient(t *testing.T) {
	ca := harness.NewCA(t)
	srvCert, srvKey := ca.Issue(t)
	srv, err := certs.MutualServer(srvCert, srvKey, ca.File, nil)
	require.NoError(t, err)
	dial := func(client *tls.Config) error {
		client.ServerName = "localhost"
		lis, err := tls.Listen("tcp", "127.0.0.1:0", srv)
		require.NoError(t, err)
		defer lis.Close()
		accepted := make(chan error, 1)
		go func() {
			c, err := lis.Accept()
			if err != nil {
				accepted <- err
				return
			}
			defer c.Close()
			accepted <- c.(*tls.Conn).Handshake()
		}()
		conn, err := tls.Dial("tcp", lis.Addr().String(), client)
		if err == nil {
			// TLS 1.3 clients finish before the server has checked their certificate: a read
			// shows the server's verdict.
			_, _ = conn.Read(make([]byte, 1))
			conn.Close()
		}
		return <-accepted
	}

	cliCert, cliKey := ca.Issue(t)
	client, err := certs.MutualClient(cliCert, cliKey, ca.File, nil)
	require.NoError(t, err)
	require.NoError(t, dial(client))

	noCert, err := certs.Client(ca.File)
	require.NoError(t, err)
	require.Error(t, dial(noCert), "a client without a certificate is refused")

	other := harness.NewCA(t)
	otherCert, otherKey := other.Issue(t)
	foreign, err := certs.MutualClient(otherCert, otherKey, ca.File, nil)
	require.NoError(t, err)
	require.Error(t, dial(foreign), "a client certificate of another CA is refused")
}
