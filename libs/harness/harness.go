// Package harness gives tests a real Postgres and a real Kafka-protocol
// broker, started by the test binary itself. It is meant for *_test.go files:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }
//
// One Postgres serves a whole test binary (started on first use, fsync off);
// every test gets its own database. Brokers are cheap and per test.
package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/razorbill/flo/libs/localbroker"
	"github.com/razorbill/flo/libs/localpg"
)

// brokerPartitions matches the default of FLO_KAFKA_PARTITIONS so tests see
// the partitioning services see in dev.
const brokerPartitions = 8

var (
	pgOnce   sync.Once
	pgServer *localpg.Server
	pgDir    string
	pgErr    error
	dbSeq    atomic.Int64
)

// Main runs the tests and stops whatever the harness started. It starts
// nothing eagerly, so test binaries that never ask for Postgres pay nothing.
func Main(m *testing.M) int {
	code := m.Run()
	if pgServer != nil {
		if err := pgServer.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "harness: stop postgres: %v\n", err)
		}
	}
	if pgDir != "" {
		if err := os.RemoveAll(pgDir); err != nil {
			fmt.Fprintf(os.Stderr, "harness: remove %s: %v\n", pgDir, err)
		}
	}
	return code
}

// Postgres returns the test binary's Postgres, starting it on first use under
// a temporary directory with fsync off. Without harness.Main it is not
// stopped explicitly but dies with the test binary (it gets SIGINT when its
// parent exits).
func Postgres(tb testing.TB) *localpg.Server {
	tb.Helper()
	pgOnce.Do(func() {
		pgDir, pgErr = os.MkdirTemp("", "flo-pg-")
		if pgErr != nil {
			return
		}
		// The server runs as the postgres user when tests run as root; it
		// must be able to enter the directory MkdirTemp made private.
		if pgErr = os.Chmod(pgDir, 0o755); pgErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		pgServer, pgErr = localpg.Start(ctx, filepath.Join(pgDir, "data"), 0, localpg.Options{Fsync: false})
	})
	if pgErr != nil {
		tb.Fatalf("harness: start postgres: %v", pgErr)
	}
	return pgServer
}

// NewDatabase creates a fresh, empty database on the test binary's Postgres
// and returns its URL.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	srv := Postgres(tb)
	name := fmt.Sprintf("test_%d_%d", os.Getpid(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.CreateDatabase(ctx, name); err != nil {
		tb.Fatalf("harness: %v", err)
	}
	return srv.URL(name)
}

// NewBroker starts a fresh kfake broker on loopback with a temporary data
// directory (so Restart keeps its records) and closes it when the test ends.
func NewBroker(tb testing.TB) *localbroker.Broker {
	tb.Helper()
	dir := tb.TempDir()
	b, err := localbroker.Start(0, dir, brokerPartitions)
	if err != nil {
		tb.Fatalf("harness: %v", err)
	}
	tb.Cleanup(b.Close)
	return b
}
