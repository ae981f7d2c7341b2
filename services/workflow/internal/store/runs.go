package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/razorbill/flo/libs/pg"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/services/workflow/internal/definition"
	"github.com/razorbill/flo/services/workflow/internal/engine"
	"github.com/razorbill/flo/services/workflow/internal/query"
)

// IdempotencyIndex is the unique index that makes one idempotency key one
// run per workflow name.
const IdempotencyIndex = "runs_idempotency_idx"

// Run is a row of runs: the engine's state of the run plus what only the
// store keeps.
type Run struct {
	engine.Run
	IdempotencyKey string
	// Depth is how many ancestors the run has.
	Depth int
	// HistorySeq is the seq of the run's last history event.
	HistorySeq int
	// TraceContext is the W3C trace context of the start.
	TraceContext map[string]string
	// Attributes are the run's search attributes, by name. Inserted with
	// the run; read by GetRun and ListRuns only.
	Attributes []definition.AttributeValue
}

const runColumns = `id::text, input, state, idempotency_key, depth, history_seq, trace_context`

func scanRuns(rows pgx.Rows) ([]*Run, error) {
	defer rows.Close()
	var out []*Run
	for rows.Next() {
		var (
			r     Run
			input []byte
			state []byte
		)
		if err := rows.Scan(&r.ID, &input, &state, &r.IdempotencyKey, &r.Depth, &r.HistorySeq, &r.TraceContext); err != nil {
			return nil, err
		}
		id := r.ID
		if err := json.Unmarshal(state, &r.Run); err != nil {
			return nil, fmt.Errorf("decode state of run %s: %w", id, err)
		}
		r.ID, r.Input = id, input
		out = append(out, &r)
	}
	return out, rows.Err()
}

// encodeState is the state column: the engine's run without its input, which
// has a column of its own that is never rewritten.
func encodeState(r engine.Run) ([]byte, error) {
	r.Input = nil
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode state of run %s: %w", r.ID, err)
	}
	return b, nil
}

// finishedAt is the finished_at column: set exactly when the run has ended.
func finishedAt(r *engine.Run) pgtype.Timestamptz {
	if !r.Status.Ended() {
		return pgtype.Timestamptz{}
	}
	if r.FinishedAt.IsZero() {
		return nullTime(r.UpdatedAt)
	}
	return nullTime(r.FinishedAt)
}

// LockRuns reads the runs with the given ids and their unconsumed signals
// (oldest first per run), and locks the runs until the transaction ends, in
// id order so that transactions locking overlapping sets cannot deadlock on
// them. Both queries go in one round trip; the signals are read once the
// locks are held. With skipLocked, runs another transaction holds are left
// out instead of waited for. Ids that do not exist are absent.
func LockRuns(ctx context.Context, db DB, ids []string, skipLocked bool) (map[string]*Run, map[string][]engine.Signal, error) {
	if len(ids) == 0 {
		return map[string]*Run{}, map[string][]engine.Signal{}, nil
	}
	q := `SELECT ` + runColumns + ` FROM runs WHERE id = ANY($1::text[]::uuid[]) ORDER BY id FOR UPDATE`
	if skipLocked {
		q += ` SKIP LOCKED`
	}
	b := &pgx.Batch{}
	b.Queue(q, ids)
	b.Queue(pendingSignalsSQL, ids)
	br := db.SendBatch(ctx, b)
	defer func() { _ = br.Close() }()
	rows, err := br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("lock %d runs: %w", len(ids), err)
	}
	runs, err := scanRuns(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("lock %d runs: %w", len(ids), err)
	}
	out := make(map[string]*Run, len(runs))
	for _, r := range runs {
		out[r.ID] = r
	}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("read pending signals: %w", err)
	}
	sigs, err := scanSignals(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("read pending signals: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, nil, fmt.Errorf("lock %d runs: %w", len(ids), err)
	}
	return out, sigs, nil
}

// GetRun reads one run of a namespace; pg.ErrNotFound when there is none.
func GetRun(ctx context.Context, db DB, namespace, id string) (*Run, error) {
	rows, err := db.Query(ctx, `SELECT `+runColumns+` FROM runs WHERE id = $1 AND namespace = $2`, id, namespace)
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	runs, err := scanRuns(rows)
	if err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("get run %s: %w", id, pg.ErrNotFound)
	}
	if err := loadAttributes(ctx, db, runs); err != nil {
		return nil, fmt.Errorf("get run %s: %w", id, err)
	}
	return runs[0], nil
}

// RunFilter selects runs of a namespace for ListRuns. Empty fields do not
// filter.
type RunFilter struct {
	Namespace     string
	Workflow      string
	Status        engine.Status
	CreatedAfter  time.Time
	CreatedBefore time.Time
	// After continues a listing after the run with this creation time and
	// id (the last of the previous page).
	AfterCreatedAt time.Time
	AfterID        string
	Limit          int
	// Where is a checked query (query.Check); nil filters nothing.
	Where query.Expr
}

// ListRuns lists runs newest first.
func ListRuns(ctx context.Context, db DB, f RunFilter) ([]*Run, error) {
	var afterID *string
	if f.AfterID != "" {
		afterID = &f.AfterID
	}
	args := []any{f.Namespace, f.Workflow, string(f.Status), nullTime(f.CreatedAfter), nullTime(f.CreatedBefore),
		nullTime(f.AfterCreatedAt), afterID, f.Limit}
	var where strings.Builder
	if f.Where != nil {
		where.WriteString("\n\tAND ")
		whereSQL(&where, f.Where, &args)
	}
	rows, err := db.Query(ctx, `
SELECT `+runColumns+` FROM runs
WHERE namespace = $1 AND ($2 = '' OR workflow = $2) AND ($3 = '' OR status = $3)
	AND ($4::timestamptz IS NULL OR created_at > $4) AND ($5::timestamptz IS NULL OR created_at < $5)
	AND ($6::timestamptz IS NULL OR (created_at, id) < ($6, $7::text::uuid))`+where.String()+`
ORDER BY created_at DESC, id DESC
LIMIT $8`, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	runs, err := scanRuns(rows)
	if err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	if err := loadAttributes(ctx, db, runs); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	return runs, nil
}

// IdempotencyKey names a run by its workflow name and idempotency key.
type IdempotencyKey struct{ Namespace, Workflow, Key string }

// RunsByIdempotencyKey returns the ids of the runs started with the given
// keys; keys without a run are absent.
func RunsByIdempotencyKey(ctx context.Context, db DB, keys []IdempotencyKey) (map[IdempotencyKey]string, error) {
	namespaces, workflows, ks := make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		namespaces[i], workflows[i], ks[i] = k.Namespace, k.Workflow, k.Key
	}
	rows, err := db.Query(ctx, `
SELECT namespace, workflow, idempotency_key, id::text FROM runs
WHERE idempotency_key <> ''
	AND (namespace, workflow, idempotency_key) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))`,
		namespaces, workflows, ks)
	if err != nil {
		return nil, fmt.Errorf("find runs by idempotency key: %w", err)
	}
	defer rows.Close()
	out := make(map[IdempotencyKey]string, len(keys))
	for rows.Next() {
		var (
			k  IdempotencyKey
			id string
		)
		if err := rows.Scan(&k.Namespace, &k.Workflow, &k.Key, &id); err != nil {
			return nil, fmt.Errorf("find runs by idempotency key: %w", err)
		}
		out[k] = id
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("find runs by idempotency key: %w", err)
	}
	return out, nil
}

// ActiveChildren returns the ids of the children of the given runs that have
// not ended.
func ActiveChildren(ctx context.Context, db DB, parentIDs []string) ([]string, error) {
	rows, err := db.Query(ctx, `
SELECT id::text FROM runs WHERE parent_run_id = ANY($1::text[]::uuid[]) AND finished_at IS NULL ORDER BY id`, parentIDs)
	if err != nil {
		return nil, fmt.Errorf("find children: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("find children: %w", err)
	}
	return ids, nil
}

// runArrays holds the columns of many runs, for statements over unnest.
type runArrays struct {
	ids, namespaces, workflows, versions, statuses, steps, waitingFor, terminals, errors, keys, parents []string
	depths, seqs                                                                                        []int32
	inputs, states                                                                                      [][]byte
	traces                                                                                              []*string
	created, updated                                                                                    []time.Time
	finished                                                                                            []pgtype.Timestamptz
}

func columns(runs []*Run) (*runArrays, error) {
	n := len(runs)
	a := &runArrays{
		ids: make([]string, n), namespaces: make([]string, n), workflows: make([]string, n), versions: make([]string, n),
		statuses: make([]string, n), steps: make([]string, n), waitingFor: make([]string, n), terminals: make([]string, n),
		errors: make([]string, n), keys: make([]string, n), parents: make([]string, n),
		depths: make([]int32, n), seqs: make([]int32, n), inputs: make([][]byte, n), states: make([][]byte, n),
		traces: make([]*string, n), created: make([]time.Time, n), updated: make([]time.Time, n),
		finished: make([]pgtype.Timestamptz, n),
	}
	for i, r := range runs {
		state, err := encodeState(r.Run)
		if err != nil {
			return nil, err
		}
		a.ids[i], a.namespaces[i], a.workflows[i], a.versions[i] = r.ID, r.Namespace, r.Workflow, r.Version
		a.statuses[i], a.steps[i], a.waitingFor[i], a.terminals[i] = string(r.Status), r.Step, r.WaitingFor, r.Terminal
		a.errors[i], a.keys[i], a.parents[i] = text.Clean(r.Error, text.MaxFreeBytes), r.IdempotencyKey, r.ParentRunID
		a.depths[i], a.seqs[i] = int32(r.Depth), int32(r.HistorySeq)
		a.inputs[i], a.states[i] = r.Input, state
		if a.inputs[i] == nil {
			a.inputs[i] = []byte{}
		}
		if r.TraceContext != nil {
			b, err := json.Marshal(r.TraceContext)
			if err != nil {
				return nil, fmt.Errorf("encode trace context of run %s: %w", r.ID, err)
			}
			s := string(b)
			a.traces[i] = &s
		}
		a.created[i], a.updated[i], a.finished[i] = r.CreatedAt, r.UpdatedAt, finishedAt(&r.Run)
	}
	return a, nil
}

// InsertRuns inserts new runs. A run whose idempotency key is taken fails
// the commit with a unique violation of IdempotencyIndex.
func (w *Writes) InsertRuns(runs []*Run) error {
	if len(runs) == 0 {
		return nil
	}
	a, err := columns(runs)
	if err != nil {
		return err
	}
	w.queue(fmt.Sprintf("insert %d runs", len(runs)), `
INSERT INTO runs (id, namespace, workflow, version, status, step, waiting_for, terminal, error, idempotency_key,
	parent_run_id, depth, input, state, history_seq, trace_context, created_at, updated_at, finished_at)
SELECT r.id, r.namespace, r.workflow, r.version, r.status, r.step, r.waiting_for, r.terminal, r.error, r.key,
	NULLIF(r.parent, '')::uuid, r.depth, r.input, r.state, r.seq, r.trace::jsonb, r.created, r.updated, r.finished
FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[],
	$10::text[], $11::text[], $12::int[], $13::bytea[], $14::bytea[], $15::int[], $16::text[], $17::timestamptz[],
	$18::timestamptz[], $19::timestamptz[])
	AS r(id, namespace, workflow, version, status, step, waiting_for, terminal, error, key,
	parent, depth, input, state, seq, trace, created, updated, finished)`,
		a.ids, a.namespaces, a.workflows, a.versions, a.statuses, a.steps, a.waitingFor, a.terminals, a.errors,
		a.keys, a.parents, a.depths, a.inputs, a.states, a.seqs, a.traces, a.created, a.updated, a.finished)
	w.insertAttributes(runs)
	return nil
}

// UpdateRuns writes the changing part of runs back: status, position, state,
// history counter and times.
func (w *Writes) UpdateRuns(runs []*Run) error {
	if len(runs) == 0 {
		return nil
	}
	a, err := columns(runs)
	if err != nil {
		return err
	}
	w.queue(fmt.Sprintf("update %d runs", len(runs)), `
UPDATE runs SET status = u.status, step = u.step, waiting_for = u.waiting_for, terminal = u.terminal, error = u.error,
	state = u.state, history_seq = u.seq, updated_at = u.updated, finished_at = u.finished
FROM unnest($1::text[]::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bytea[], $8::int[],
	$9::timestamptz[], $10::timestamptz[])
	AS u(id, status, step, waiting_for, terminal, error, state, seq, updated, finished)
WHERE runs.id = u.id`,
		a.ids, a.statuses, a.steps, a.waitingFor, a.terminals, a.errors, a.states, a.seqs, a.updated, a.finished)
	return nil
}
