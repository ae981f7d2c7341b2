package view_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// refuseTask makes Postgres refuse every row of task id (in state, when not
// empty), as a bad migration or trigger would, until the returned function
// drops the trigger.
func refuseTask(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, state string) func() {
	t.Helper()
	when := fmt.Sprintf(`NEW.id = '%s'`, id)
	if state != "" {
		when += fmt.Sprintf(` AND NEW.state = '%s'`, state)
	}
	_, err := pool.Exec(t.Context(), `
		CREATE FUNCTION refuse_task() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'task % is refused for the test', NEW.id; END $$;
		CREATE TRIGGER refuse_task BEFORE INSERT OR UPDATE ON tasks FOR EACH ROW
		WHEN (`+when+`) EXECUTE FUNCTION refuse_task()`)
	require.NoError(t, err)
	return func() {
		_, err := pool.Exec(t.Context(), `DROP TRIGGER refuse_task ON tasks; DROP FUNCTION refuse_task()`)
		require.NoError(t, err)
	}
}

func requireOffsets(t *testing.T, pool *pgxpool.Pool, partition int32, events, commands int64) {
	t.Helper()
	e, c, err := view.Offsets(t.Context(), pool, partition)
	require.NoError(t, err)
	require.Equal(t, [2]int64{events, commands}, [2]int64{e, c}, "offsets of partition %d", partition)
}

func TestRefusedStateIsSetAsideAndLandsOnceFixed(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes, lines, reader := observed(t, pool)
	ctx := t.Context()

	const n = 1000
	entries := make([]view.Entry, n)
	for i := range entries {
		entries[i] = view.Entry{Partition: int32(i % 2), Offset: int64(i), CmdOffset: int64(i / 2), Task: queued("ns")}
	}
	bad := entries[500]
	fixed := refuseTask(t, pool, bad.Task.ID, "")
	m.Add(entries...)
	require.NoError(t, m.Flush(ctx))

	// The other 999 land, in about one transaction per halving.
	var rows, xids int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM tasks`).Scan(&rows, &xids))
	require.Equal(t, n-1, rows)
	require.LessOrEqual(t, xids, 10, "rows written in %d transactions", xids)
	t.Logf("%d rows around a refused one written in %d transactions", rows, xids)
	found, err := view.Existing(ctx, pool, []uuid.UUID{bad.Task.ID})
	require.NoError(t, err)
	require.Empty(t, found)
	// Partition 0 stops at the refused state (a rebuild replays it), with
	// the checkpoint of the state before it; partition 1 is whole.
	requireOffsets(t, pool, 0, 500, 249)
	requireOffsets(t, pool, 1, n, (n-1)/2)
	require.Equal(t, map[int32]int64{0: 499, 1: n - 1}, flushes.get())
	require.Equal(t, int64(1), m.Lag())
	errs := lines.errorLines()
	require.Len(t, errs, 1)
	require.Equal(t, bad.Task.ID, errs[0].attrs["task_id"])
	require.Equal(t, int64(0), errs[0].attrs["partition"])
	require.Equal(t, int64(500), errs[0].attrs["offset"])
	require.ErrorContains(t, errs[0].attrs["error"].(error), "is refused for the test")
	require.Equal(t, map[string]int64{"flo.dispatcher.view.refused": 1, "flo.dispatcher.view.rows_written": n - 1}, collect(t, reader))

	// Tried again while the cause stays: neither logged nor counted again,
	// and the offsets wait.
	require.NoError(t, m.Flush(ctx))
	require.Len(t, lines.errorLines(), 1)
	require.Equal(t, int64(1), m.Lag())
	requireOffsets(t, pool, 0, 500, 249)
	require.Equal(t, map[string]int64{"flo.dispatcher.view.refused": 1, "flo.dispatcher.view.rows_written": n - 1}, collect(t, reader))

	fixed()
	require.NoError(t, m.Flush(ctx))
	require.Zero(t, m.Lag())
	require.Equal(t, bad.Task, load(t, pool, bad.Task))
	requireOffsets(t, pool, 0, n-1, (n-2)/2)
	requireOffsets(t, pool, 1, n, (n-1)/2)
	require.Equal(t, map[int32]int64{0: n - 2, 1: n - 1}, flushes.get())
	require.Equal(t, map[string]int64{"flo.dispatcher.view.refused": 1, "flo.dispatcher.view.rows_written": n}, collect(t, reader))
	infos := lines.infoMessages()
	require.Len(t, infos, 1)
	require.Equal(t, bad.Task.ID, infos[0].attrs["task_id"])
}

func TestNewerStateSupersedesARefusedOne(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes := newMaterializer(t, pool, nil)
	ctx := t.Context()

	created, other := queued("ns"), queued("ns")
	refuseTask(t, pool, created.ID, "queued")
	m.Add(view.Entry{Partition: 2, Offset: 3, CmdOffset: 1, Task: created}, view.Entry{Partition: 2, Offset: 4, CmdOffset: 2, Task: other})
	require.NoError(t, m.Flush(ctx))
	require.Equal(t, other, load(t, pool, other))
	requireOffsets(t, pool, 2, 3, 0)
	require.Equal(t, map[int32]int64{2: 2}, flushes.get())

	// The started state lands with the refused creation's payload, and
	// the offsets pass both.
	started := running(created)
	m.Add(view.Entry{Partition: 2, Offset: 5, CmdOffset: 3, Task: started})
	require.NoError(t, m.Flush(ctx))
	require.Zero(t, m.Lag())
	want := started
	want.Payload = created.Payload
	require.Equal(t, want, load(t, pool, created))
	requireOffsets(t, pool, 2, 6, 3)
	require.Equal(t, map[int32]int64{2: 5}, flushes.get())
}

func TestRunTriesRefusedStatesAgain(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes, lines, _ := observed(t, pool)
	run(t, m)

	bad, good := queued("ns"), queued("ns")
	fixed := refuseTask(t, pool, bad.ID, "")
	m.Add(view.Entry{Partition: 0, Offset: 1, CmdOffset: 1, Task: bad}, view.Entry{Partition: 0, Offset: 2, CmdOffset: 2, Task: good})
	require.Eventually(t, func() bool { return len(lines.errorLines()) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, good, load(t, pool, good))
	require.Equal(t, int64(1), m.Lag())
	fixed()
	require.Eventually(t, func() bool { return m.Lag() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, bad, load(t, pool, bad))
	requireOffsets(t, pool, 0, 3, 2)
	require.Equal(t, map[int32]int64{0: 2}, flushes.get())
	warns, _ := lines.counts()
	require.Zero(t, warns, "a refused row is no failed flush")
}

// A failure every write of tasks hits, of no row in particular, sets no row
// aside: the whole batch waits.
func TestTableWideFailureKeepsTheWholeBatch(t *testing.T) {
	t.Parallel()
	pool := openDB(t)
	m, flushes, lines, _ := observed(t, pool)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_all() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'tasks are read only for the test'; END $$;
		CREATE TRIGGER refuse_all BEFORE INSERT ON tasks FOR EACH STATEMENT EXECUTE FUNCTION refuse_all()`)
	require.NoError(t, err)
	first, second := queued("ns"), queued("ns")
	m.Add(view.Entry{Partition: 0, Offset: 1, CmdOffset: 1, Task: first}, view.Entry{Partition: 0, Offset: 2, CmdOffset: 2, Task: second})
	require.ErrorContains(t, m.Flush(ctx), "a write of no task fails too")
	require.Empty(t, lines.errorLines())
	require.Equal(t, int64(2), m.Lag())
	requireOffsets(t, pool, 0, 0, 0)

	_, err = pool.Exec(ctx, `DROP TRIGGER refuse_all ON tasks`)
	require.NoError(t, err)
	require.NoError(t, m.Flush(ctx))
	require.Zero(t, m.Lag())
	require.Equal(t, first, load(t, pool, first))
	requireOffsets(t, pool, 0, 3, 2)
	require.Equal(t, map[int32]int64{0: 2}, flushes.get())
}
