package harness_test

import (
	"context"
	"net"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

func TestDatabasesAreSeparate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := harness.NewDatabase(t), harness.NewDatabase(t)
	require.NotEqual(t, a, b)
	require.Same(t, harness.Postgres(t), harness.Postgres(t), "one server per test binary")

	conn, err := pgx.Connect(ctx, a)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `CREATE TABLE only_in_a (x int)`)
	require.NoError(t, err)

	other, err := pgx.Connect(ctx, b)
	require.NoError(t, err)
	defer other.Close(ctx)
	var n int
	require.NoError(t, other.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'`).Scan(&n))
	require.Zero(t, n)
}

func TestBrokersAreSeparate(t *testing.T) {
	t.Parallel()
	a, b := harness.NewBroker(t), harness.NewBroker(t)
	require.NotEqual(t, a.Addrs(), b.Addrs())
}

func TestDeadPeerRefusesEveryConnection(t *testing.T) {
	addr := harness.DeadPeer(t)
	for range 3 {
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		n, err := conn.Read(make([]byte, 1))
		require.Zero(t, n)
		require.Error(t, err, "the dead peer closes the connection")
		require.NoError(t, conn.Close())
	}
}
