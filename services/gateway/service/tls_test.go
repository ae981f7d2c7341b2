package service_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	flo "github.com/razorbill/flo-go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/razorbill/flo/libs/certs"
	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// edgeFiles are a gateway's TLS files: the CA its clients trust, and the
// certificate and key it serves, at fixed paths that a rotation replaces.
type edgeFiles struct {
	ca, cert, key string
	authority     *harness.CA
	// serial is the serial number of the certificate in the files.
	serial string
}

// newEdgeFiles makes a CA and installs a certificate it signed.
func newEdgeFiles(t *testing.T) *edgeFiles {
	t.Helper()
	ca := harness.NewCA(t)
	dir := t.TempDir()
	f := &edgeFiles{ca: ca.File, cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), authority: ca}
	f.rotate(t)
	return f
}

// rotate replaces the certificate and key with a new pair of the CA, by
// renames, as a renewed Kubernetes Secret does.
func (f *edgeFiles) rotate(t *testing.T) {
	t.Helper()
	cert, key := f.authority.Issue(t)
	require.NoError(t, os.Rename(key, f.key))
	require.NoError(t, os.Rename(cert, f.cert))
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	require.NoError(t, err)
	f.serial = pair.Leaf.SerialNumber.String()
}

// servedSerial is the serial number of the certificate a new handshake
// with addr sees, verified against the CA; "" when the handshake fails.
func (f *edgeFiles) servedSerial(addr string, protos ...string) string {
	cfg, err := certs.Client(f.ca)
	if err != nil {
		return ""
	}
	cfg.NextProtos = protos
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return ""
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestEdgeTLS runs a gateway with edge TLS: an SDK worker and REST calls
// verified against a CA made here get work done, plaintext and another CA are
// refused, and a certificate replaced in the files is served to new
// handshakes without a restart.
func TestEdgeTLS(t *testing.T) {
	files := newEdgeFiles(t)
	s := newStack(t, stackOptions{tls: files})
	ctx := testContext(t)
	grpcAddr, httpAddr := s.gateway.GRPCAddr(), s.gateway.HTTPAddr()

	client := flo.NewClient(grpcAddr, flo.WithCAFile(files.ca), flo.WithToken(adminToken))
	require.NoError(t, client.Connect())
	t.Cleanup(func() { _ = client.Close() })
	_, err := client.RegisterAction(ctx, "greet", flo.ActionOptions{Timeout: 10 * time.Second})
	require.NoError(t, err)
	worker, err := client.NewActionWorker(flo.ActionWorkerOptions{WorkerID: "tls-worker"})
	require.NoError(t, err)
	worker.MustRegisterAction("greet", func(actx *flo.ActionContext) ([]byte, error) {
		return actx.Bytes(map[string]string{"greeting": "hello"})
	})
	wctx, stopWorker := context.WithCancel(context.Background())
	workerDone := make(chan error, 1)
	go func() { workerDone <- worker.Start(wctx) }()
	t.Cleanup(func() {
		stopWorker()
		<-workerDone
	})

	// REST over https invokes; the worker over TLS answers.
	invokeAndAwait := func(key string) {
		t.Helper()
		inv := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/greet/invoke", map[string]any{"input": 1, "idempotencyKey": key})
		require.Equal(t, http.StatusOK, inv.status, "%s", inv.raw)
		id, _ := inv.body["taskId"].(string)
		require.NotEmpty(t, id)
		var got restResponse
		require.Eventually(t, func() bool {
			got = s.rest(t, http.MethodGet, "/v1/namespaces/default/tasks/"+id+"/await?timeoutMs=2000", nil)
			return got.body["status"] == "TASK_STATUS_COMPLETED"
		}, wait, 10*time.Millisecond, "last answer: %s", got.raw)
		require.Equal(t, map[string]any{"greeting": "hello"}, got.body["output"])
		require.Equal(t, "tls-worker", got.body["workerId"])
	}
	invokeAndAwait("before-rotation")

	// Plaintext is refused on both ports, and so is a client trusting
	// another CA.
	plain, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(harness.Bearer(adminToken)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	_, err = flov1.NewNamespaceServiceClient(plain).ListNamespaces(ctx, &flov1.ListNamespacesRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "error: %v", err)
	code, body := get(t, "http://"+httpAddr+"/healthz", "")
	require.Equal(t, http.StatusBadRequest, code, "%s", body)
	require.Contains(t, string(body), "HTTPS")
	other := flo.NewClient(grpcAddr, flo.WithCAFile(harness.NewCA(t).File), flo.WithToken(adminToken))
	require.NoError(t, other.Connect())
	t.Cleanup(func() { _ = other.Close() })
	_, err = other.ListNamespaces(ctx)
	require.ErrorContains(t, err, "certificate")

	// A new pair in the files is served to new handshakes on both ports
	// (the gateway looks at the files at most once a second); the worker's
	// connection carries on and new clients connect.
	require.Equal(t, files.serial, files.servedSerial(grpcAddr, "h2"))
	require.Equal(t, files.serial, files.servedSerial(httpAddr))
	first := files.serial
	files.rotate(t)
	require.NotEqual(t, first, files.serial)
	require.Eventually(t, func() bool {
		return files.servedSerial(grpcAddr, "h2") == files.serial && files.servedSerial(httpAddr) == files.serial
	}, wait, 20*time.Millisecond)
	invokeAndAwait("after-rotation")
	again := flo.NewClient(grpcAddr, flo.WithCAFile(files.ca), flo.WithToken(adminToken))
	require.NoError(t, again.Connect())
	t.Cleanup(func() { _ = again.Close() })
	_, err = again.ListNamespaces(ctx)
	require.NoError(t, err)
}
