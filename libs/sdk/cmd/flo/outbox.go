package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/razorbill/flo/libs/config"
	"github.com/razorbill/flo/libs/outbox"
	"github.com/razorbill/flo/services/devstack"
)

// outboxSchemas are the services with an outbox, by Postgres schema.
var outboxSchemas = []string{"dispatcher", "registry", "workflow"}

// dbConnectTimeout bounds reaching the database: an operator command fails
// rather than waiting for a database that is down.
const dbConnectTimeout = 10 * time.Second

// deadRecord is how `flo outbox dead list` prints a dead record.
type deadRecord struct {
	ID         int64     `json:"id"`
	OutboxID   int64     `json:"outbox_id"`
	DeadAt     time.Time `json:"dead_at"`
	WrittenAt  time.Time `json:"written_at"`
	Topic      string    `json:"topic"`
	Key        string    `json:"key"`
	Error      string    `json:"error"`
	ValueBytes int       `json:"value_bytes"`
}

// outboxFlags select a service's outbox in a database.
type outboxFlags struct {
	schema      string
	databaseURL string
}

func (f *outboxFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.schema, "schema", "", fmt.Sprintf("the service whose outbox to read: one of %v", outboxSchemas))
	cmd.Flags().StringVar(&f.databaseURL, "database-url", "",
		"the services' Postgres (default: FLO_DATABASE_URL, else the private Postgres of `flo dev` on FLO_DEV_POSTGRES_PORT)")
}

// withDB checks the flags, connects to the database and runs fn.
func (f *outboxFlags) withDB(ctx context.Context, fn func(*pgx.Conn) error) error {
	if !slices.Contains(outboxSchemas, f.schema) {
		return fmt.Errorf("--schema must be one of %v, got %q", outboxSchemas, f.schema)
	}
	dbURL := f.databaseURL
	if dbURL == "" {
		var cfg devstack.Config
		if err := config.Load(ctx, &cfg); err != nil {
			return fmt.Errorf("load configuration: %w", err)
		}
		dbURL = cfg.PostgresURL()
	}
	cctx, cancel := context.WithTimeout(ctx, dbConnectTimeout)
	conn, err := pgx.Connect(cctx, dbURL)
	cancel()
	if err != nil {
		return fmt.Errorf("connect to %s: %w", redactPassword(dbURL), err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return fn(conn)
}

// newOutboxCmd reads the services' outboxes directly in Postgres: an
// operator's tool, next to the gateway's API rather than through it.
func newOutboxCmd() *cobra.Command {
	cmd := newGroupCmd("outbox", "Inspect the services' outboxes in Postgres")
	dead := newGroupCmd("dead", "List and requeue the records the log refused for good (outbox_dead)")
	cmd.AddCommand(dead)

	var (
		listFlags outboxFlags
		limit     int
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List a service's dead outbox records, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 {
				return errors.New("--limit must be positive")
			}
			return listFlags.withDB(cmd.Context(), func(conn *pgx.Conn) error {
				records, err := outbox.ListDead(cmd.Context(), conn, listFlags.schema, limit)
				if err != nil {
					return err
				}
				out := make([]deadRecord, len(records))
				for i, d := range records {
					out[i] = deadRecord{ID: d.ID, OutboxID: d.OutboxID, DeadAt: d.DeadAt, WrittenAt: d.WrittenAt,
						Topic: d.Topic, Key: string(d.Key), Error: d.Error, ValueBytes: len(d.Value)}
				}
				return printJSON(cmd, out)
			})
		},
	}
	listFlags.register(list)
	list.Flags().IntVar(&limit, "limit", 100, "at most this many")
	dead.AddCommand(list)

	var requeueFlags outboxFlags
	requeue := &cobra.Command{
		Use:   "requeue ID...",
		Short: "Move dead records back into their service's outbox, once their cause is fixed",
		Long: `Moves the dead records with these ids back into the service's outbox, a row each, where its
relay publishes them (within a second) after everything written since. Fix the cause first (a
larger FLO_MAX_PAYLOAD_BYTES on every service, a topic whose max.message.bytes takes the record),
or the log refuses them again and they come back here.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids := make([]int64, len(args))
			for i, a := range args {
				id, err := strconv.ParseInt(a, 10, 64)
				if err != nil {
					return fmt.Errorf("dead record id %q is not a number", a)
				}
				ids[i] = id
			}
			return requeueFlags.withDB(cmd.Context(), func(conn *pgx.Conn) error {
				moved, err := outbox.Requeue(cmd.Context(), conn, requeueFlags.schema, ids)
				if err != nil {
					return err
				}
				return printJSON(cmd, map[string]int64{"requeued": moved})
			})
		},
	}
	requeueFlags.register(requeue)
	dead.AddCommand(requeue)
	return cmd
}
