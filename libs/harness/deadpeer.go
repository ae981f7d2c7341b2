package harness

import (
	"errors"
	"net"
	"testing"
)

// DeadPeer returns a loopback address standing for a peer that is down: its
// listener closes every connection at once, so gRPC clients see Unavailable
// and readiness probes fail, and it is held until the test ends, so no other
// process can take the port meanwhile (as it could after reserving a port
// and closing it).
func DeadPeer(tb testing.TB) string {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen for a dead peer: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := lis.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				_ = conn.Close()
			}
		}
	}()
	tb.Cleanup(func() {
		_ = lis.Close()
		<-done
	})
	return lis.Addr().String()
}
