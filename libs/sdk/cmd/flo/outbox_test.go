package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/harness"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/libs/pg"
)

// A record the log refused lands in outbox_dead through a real relay; the
// CLI lists it from the database FLO_DATABASE_URL names and requeues it
// into the outbox. Not parallel: it sets FLO_DATABASE_URL.
func TestOutboxDeadListAndRequeue(t *testing.T) {
	ctx := context.Background()
	dbURL := harness.NewDatabase(t)
	pool, err := pg.Connect(ctx, dbURL, "workflow", 4, nil)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pg.Migrate(ctx, pool, "workflow", fstest.MapFS{
		"0001_outbox.sql":  {Data: []byte("-- +goose Up\n" + outbox.Migration)},
		"0002_batches.sql": {Data: []byte("-- +goose Up\n" + outbox.BatchMigration)},
		"0003_dead.sql":    {Data: []byte("-- +goose Up\n" + outbox.DeadMigration)},
	}))
	broker := harness.NewBroker(t)
	producer, err := kafka.NewClient(broker.Kafka())
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	require.NoError(t, kafka.EnsureTopics(ctx, producer, 1, "events"))

	huge := bytes.Repeat([]byte("x"), 2<<20) // past the client's 1 MiB batches
	require.NoError(t, pg.InTx(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Write(ctx, tx,
			outbox.Record{Topic: "events", Key: []byte("run-1"), Value: []byte("fine")},
			outbox.Record{Topic: "events", Key: []byte("run-1"), Value: huge})
	}))
	relay := outbox.NewRelay(pool, producer, nil)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	drained, err := relay.Flush(ctx, 20*time.Second)
	stop()
	require.NoError(t, <-done)
	require.NoError(t, err)
	require.True(t, drained)

	t.Setenv("FLO_DATABASE_URL", dbURL)
	code, stdout, stderr := runCLI(t, "outbox", "dead", "list", "--schema", "workflow")
	require.Zero(t, code, stderr)
	var listed []deadRecord
	require.NoError(t, json.Unmarshal([]byte(stdout), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, "events", listed[0].Topic)
	require.Equal(t, "run-1", listed[0].Key)
	require.Equal(t, len(huge), listed[0].ValueBytes)
	require.Contains(t, listed[0].Error, "MESSAGE_TOO_LARGE")
	require.False(t, listed[0].DeadAt.IsZero())

	code, stdout, stderr = runCLI(t, "outbox", "dead", "list", "--schema", "registry", "--database-url", dbURL)
	require.NotZero(t, code, "the registry has no tables in this database")
	require.Empty(t, stdout)
	require.Contains(t, stderr, `"registry"."outbox_dead"`)

	code, stdout, stderr = runCLI(t, "outbox", "dead", "requeue", strconv.FormatInt(listed[0].ID, 10), "--schema", "workflow", "--database-url", dbURL)
	require.Zero(t, code, stderr)
	require.JSONEq(t, `{"requeued": 1}`, stdout)
	code, stdout, stderr = runCLI(t, "outbox", "dead", "list", "--schema", "workflow")
	require.Zero(t, code, stderr)
	require.JSONEq(t, `[]`, stdout)
	var waiting int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&waiting))
	require.Equal(t, 1, waiting, "the requeued record waits for the relay")
}

func TestOutboxArgumentValidation(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "no schema", args: []string{"outbox", "dead", "list"}, wantErr: "--schema must be one of [dispatcher registry workflow]"},
		{name: "unknown schema", args: []string{"outbox", "dead", "list", "--schema", "streams"}, wantErr: `got "streams"`},
		{name: "zero limit", args: []string{"outbox", "dead", "list", "--schema", "workflow", "--limit", "0"}, wantErr: "--limit must be positive"},
		{name: "requeue without id", args: []string{"outbox", "dead", "requeue", "--schema", "workflow"}, wantErr: "requires at least 1 arg(s)"},
		{name: "requeue bad id", args: []string{"outbox", "dead", "requeue", "seven", "--schema", "workflow"}, wantErr: `dead record id "seven" is not a number`},
		{name: "unknown subcommand", args: []string{"outbox", "dead", "purge"}, wantErr: `unknown command "purge"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runCLI(t, tt.args...)
			require.Equal(t, 1, code)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tt.wantErr)
		})
	}
}
