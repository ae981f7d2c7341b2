// Package store holds every SQL statement of the registry and the row types
// they read and write. Functions take a DB so the same query runs on the pool
// or inside a caller's transaction; callers own transaction boundaries.
package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what both *pgxpool.Pool and pgx.Tx offer.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Status is a worker's status column.
type Status string

// Worker statuses. Draining is sticky: only deregistration ends it.
// Unhealthy means silent for longer than the heartbeat timeout; the next
// heartbeat makes the worker active or idle again.
const (
	Active    Status = "active"
	Idle      Status = "idle"
	Draining  Status = "draining"
	Unhealthy Status = "unhealthy"
)

// Type is what kind of work a worker does.
type Type string

// Worker types.
const (
	ActionWorker Type = "action"
	StreamWorker Type = "stream"
)

// Kind is what a process is.
type Kind string

// Process kinds: an action name, or a "stream/group" pair.
const (
	ActionProcess Kind = "action"
	StreamProcess Kind = "stream_consumer"
)

// Worker is a row of workers with its processes. Metadata is JSON object
// text, empty when the worker sent none.
type Worker struct {
	Namespace      string
	ID             string
	Type           Type
	Status         Status
	MaxConcurrency int32
	CurrentLoad    int32
	CPULoad        float64
	MemoryLoad     float64
	MachineID      string
	Metadata       string
	TasksCompleted int64
	TasksFailed    int64
	RegisteredAt   time.Time
	LastHeartbeat  time.Time
	Processes      []Process
}

// Process is a row of worker_processes. A zero LastRunAt means it never ran.
type Process struct {
	Name      string
	Kind      Kind
	RunCount  int64
	FailCount int64
	LastRunAt time.Time
}

// Change is a status change of one worker.
type Change struct {
	Namespace string
	WorkerID  string
	From      Status
	To        Status
}
