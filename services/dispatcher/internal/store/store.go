// Package store holds every SQL statement of the dispatcher and the row types
// they read and write. Functions take a DB so the same query runs on the pool
// or inside a caller's transaction; callers own transaction boundaries.
package store

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/razorbill/flo/libs/backoff"
)

// DB is what both *pgxpool.Pool and pgx.Tx offer.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Status is a task's state column.
type Status string

// Task states. Completed, Failed and DeadLettered are final; a dead letter can
// be requeued by hand. Waiting is a running attempt whose result comes later,
// by completion token, without a lease.
const (
	Queued       Status = "queued"
	Running      Status = "running"
	Waiting      Status = "waiting"
	Completed    Status = "completed"
	Failed       Status = "failed"
	DeadLettered Status = "dead_lettered"
)

// ActionsChannel is the NOTIFY channel announcing "namespace/action settings
// changed", so replicas drop cached settings.
const ActionsChannel = "flo_actions"

// Key is how the dispatcher names one queue: namespace and action joined by a
// slash, which neither name may contain.
func Key(namespace, action string) string { return namespace + "/" + action }

// Namespace is a row of namespaces.
type Namespace struct {
	Name      string
	CreatedAt time.Time
}

// Settings are the per-action execution settings copied onto each task.
type Settings struct {
	Timeout     time.Duration
	MaxAttempts int32
	Backoff     backoff.Policy
}

// Action is a row of actions.
type Action struct {
	Namespace string
	Name      string
	Settings
	Enabled   bool
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Task is a row of tasks. Zero times mean NULL.
type Task struct {
	ID        uuid.UUID
	Namespace string
	Action    string
	Status    Status
	Priority  int32
	Payload   []byte
	Result    []byte
	Outcome   string
	Error     string
	// TimedOut says the last attempt that ended ran out of time.
	TimedOut bool
	// ErrorCode is the worker's code for the last failed attempt.
	ErrorCode      string
	IdempotencyKey string
	Attempt        int32
	MaxAttempts    int32
	WorkerID       string
	CreatedAt      time.Time
	RunAt          time.Time
	StartedAt      time.Time
	FinishedAt     time.Time
	UpdatedAt      time.Time
	// CompleteBy is the deadline of a waiting task; zero otherwise.
	CompleteBy time.Time
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

func fromMS(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// timeOrZero turns a nullable timestamp into the zero time for NULL.
func timeOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
