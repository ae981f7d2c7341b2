package flo_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// nameserver is a DNS server on loopback that answers every question "no such name" and
// counts the TXT questions it gets.
type nameserver struct {
	conn net.PacketConn
	mu   sync.Mutex
	txt  []string
}

func startNameserver(t *testing.T) *nameserver {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	ns := &nameserver{conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ns.serve()
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return ns
}

func (ns *nameserver) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := ns.conn.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		var p dnsmessage.Parser
		header, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		if q.Type == dnsmessage.TypeTXT {
			ns.mu.Lock()
			ns.txt = append(ns.txt, q.Name.String())
			ns.mu.Unlock()
		}
		answer := dnsmessage.Message{
			Header:    dnsmessage.Header{ID: header.ID, Response: true, RCode: dnsmessage.RCodeNameError},
			Questions: []dnsmessage.Question{q},
		}
		if b, err := answer.Pack(); err == nil {
			_, _ = ns.conn.WriteTo(b, from)
		}
	}
}

func (ns *nameserver) txtQuestions() []string {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return append([]string(nil), ns.txt...)
}

// Many clients starting at once at a host name (the README's localhost:9000) stalled: gRPC's
// DNS resolver asked the nameserver for the TXT record _grpc_config.<host> before handing the
// connection its addresses, and a nameserver dropping queries under that load held each client
// for its 5 s timeout, twice. The clients now ask for no service config; the nameserver here
// answers at once, so it counts the questions instead of timing them.
func TestClientsAtAHostNameAskTheNameserverNoServiceConfig(t *testing.T) {
	t.Parallel()
	p, peerClient := startPeer(t)
	ns := startNameserver(t)
	target := localhostVia(t, ns, peerClient.Addr())

	const clients = 50
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for range clients {
		wg.Go(func() {
			c := flo.NewClient(target, flo.WithNamespace("myapp"))
			if err := c.Connect(); err != nil {
				errs <- err
				return
			}
			defer c.Close()
			_, err := c.ListWorkers(context.Background())
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, clients, p.registry.count("list myapp"))
	require.Empty(t, ns.txtQuestions(), "clients asked the nameserver for a service config")
}

// localhostVia is a target for addr's port at localhost, resolved by gRPC's DNS resolver with
// ns as its nameserver; localhost itself comes from /etc/hosts.
func localhostVia(t *testing.T, ns *nameserver, addr string) string {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	return "dns://" + ns.conn.LocalAddr().String() + "/localhost:" + port
}

// A gRPC client with default options asks the counting nameserver for the service config, so
// the test above would see the SDK's clients ask.
func TestNameserverCountsAPlainClientsServiceConfigQuestion(t *testing.T) {
	t.Parallel()
	p, peerClient := startPeer(t)
	ns := startNameserver(t)
	conn, err := grpc.NewClient(localhostVia(t, ns, peerClient.Addr()), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	_, err = flov1.NewWorkerRegistryServiceClient(conn).ListWorkers(context.Background(), &flov1.ListWorkersRequest{Namespace: "myapp"})
	require.NoError(t, err)
	require.Equal(t, 1, p.registry.count("list myapp"))
	require.Equal(t, []string{"_grpc_config.localhost."}, ns.txtQuestions())
}
