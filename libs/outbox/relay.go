package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/libs/telemetry"
)

const (
	// batchSize bounds the rows published per transaction; each holds the
	// records of one Write.
	batchSize = 500
	// pollInterval is the safety poll that catches rows whose Notify was
	// missed (another replica's writes, a relay that was busy).
	pollInterval = time.Second
	// busyRetry is how soon a relay that found another one holding the
	// schema's lock tries again after a wake-up: the holder may have read
	// its batch before our rows committed.
	busyRetry = 100 * time.Millisecond
	// flushPoll is how often Flush looks whether the outbox is empty yet.
	flushPoll = 20 * time.Millisecond
)

// retryPolicy spaces the attempts at a batch that failed for a reason that
// may pass (the broker or Postgres unreachable).
var retryPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// refusals are the errors with which the log refuses a record for good:
// another attempt gets the same answer. A record too large for the
// producer's batches fails in the client with kerr.MessageTooLarge too.
var refusals = []error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidRecord, kerr.CorruptMessage, kerr.InvalidTopicException}

// refused reports whether err is one of refusals.
func refused(err error) bool {
	return slices.ContainsFunc(refusals, func(r error) bool { return errors.Is(err, r) })
}

// Relay publishes committed outbox rows in id order and deletes them.
type Relay struct {
	pool     *pgxpool.Pool
	producer *kgo.Client
	log      *slog.Logger
	wake     chan struct{}
	// dead counts records moved to outbox_dead; Run sets it.
	dead metric.Int64Counter
}

// NewRelay returns a relay for the outbox table of pool's schema (the pool's
// search_path, as set by pg.Connect) that publishes through producer.
//
// Rows are published in batches of up to 500 per transaction; a batch is
// produced synchronously, then deleted, then committed. Only one relay per
// schema works at a time (pg_try_advisory_xact_lock), so rows of one key keep
// their order across replicas. A produce failure rolls back (the rows stay)
// and retries with backoff, unless the log refused a record for good (too
// large, invalid): that record moves to the schema's outbox_dead table and
// the rest of the batch is published.
func NewRelay(pool *pgxpool.Pool, producer *kgo.Client, log *slog.Logger) *Relay {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{pool: pool, producer: producer, log: log, wake: make(chan struct{}, 1), dead: noop.Int64Counter{}}
}

// Notify wakes the relay; call it after committing a transaction that wrote
// to the outbox. It never blocks: wake-ups coalesce.
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays until ctx ends and returns nil then. While it runs, the
// outbox's backlog is reported through the global meter provider as
// flo.outbox.backlog and flo.outbox.oldest_age, and the records moved to
// outbox_dead as flo.outbox.dead_lettered, by schema.
func (r *Relay) Run(ctx context.Context) error {
	if reg, err := r.registerGauges(); err != nil {
		r.log.WarnContext(ctx, "outbox gauges not reported", "error", err)
	} else {
		defer func() { _ = reg.Unregister() }()
	}
	if dead, err := otel.Meter(meterName).Int64Counter("flo.outbox.dead_lettered", metric.WithUnit("{record}"),
		metric.WithDescription("Outbox records the log refused for good (too large, invalid), moved to the outbox_dead table.")); err != nil {
		r.log.WarnContext(ctx, "outbox dead-letter counter not reported", "error", err)
	} else {
		r.dead = dead
	}
	poll := time.NewTicker(pollInterval)
	defer poll.Stop()
	backoff := retryPolicy.Backoff()
	for {
		moved, busy, err := r.relayBatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var wait <-chan time.Time
		switch {
		case err != nil:
			delay := backoff.NextBackOff()
			r.log.WarnContext(ctx, "relay outbox failed; retrying", "retry_in", delay, "error", err)
			wait = time.After(delay)
		case moved == batchSize:
			// A full batch: there is probably more right now.
			backoff.Reset()
			continue
		case busy:
			backoff.Reset()
			wait = time.After(busyRetry)
		default:
			backoff.Reset()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wait:
		case <-r.wake:
		case <-poll.C:
		}
	}
}

// Flush wakes the relay and waits, up to timeout, until the outbox is empty,
// so a stopping service publishes what it committed before it goes. Run must
// be running meanwhile. drained is false with a nil error when time ran out
// first; rows left behind stay in the outbox for the next relay to publish.
func (r *Relay) Flush(ctx context.Context, timeout time.Duration) (drained bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		r.Notify()
		var pending bool
		if err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox)`).Scan(&pending); err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			return false, fmt.Errorf("flush outbox: %w", err)
		}
		if !pending {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, nil
		case <-time.After(flushPoll):
		}
	}
}

// FlushAtStop returns a stop hook (libs/stage OnStop) that publishes what
// the outbox still holds, for at most timeout, before the relay stops; what
// is left is published by the next start, so a slow broker only delays it.
func (r *Relay) FlushAtStop(timeout time.Duration) func(context.Context) {
	return func(ctx context.Context) {
		switch drained, err := r.Flush(ctx, timeout); {
		case err != nil:
			r.log.Warn("flush outbox at stop; the next start publishes the rest", "error", err)
		case !drained:
			r.log.Warn("outbox not empty at stop; the next start publishes the rest")
		}
	}
}

// pending is one record of an outbox row, on its way to the log.
type pending struct {
	row     int64
	written time.Time
	headers map[string]string
	record  *kgo.Record
}

// deadRecord is a record the log refused for good, and why.
type deadRecord struct {
	pending
	err error
}

// relayBatch publishes and deletes up to batchSize rows in one transaction,
// moving the records the log refuses for good to outbox_dead. busy reports
// that another relay holds the schema's lock.
func (r *Relay) relayBatch(ctx context.Context) (moved int, busy bool, err error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("relay outbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var (
		locked bool
		schema string
	)
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.outbox')), current_schema()`).Scan(&locked, &schema); err != nil {
		return 0, false, fmt.Errorf("relay outbox: lock: %w", err)
	}
	if !locked {
		return 0, true, nil
	}
	ids, batch, err := readBatch(ctx, tx)
	if err != nil || len(ids) == 0 {
		return 0, false, err
	}
	dead, err := r.publish(ctx, batch)
	if err != nil {
		return 0, false, fmt.Errorf("relay outbox: produce %d records of %d rows: %w", len(batch), len(ids), err)
	}
	if err := bury(ctx, tx, dead); err != nil {
		return 0, false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = ANY($1)`, ids); err != nil {
		return 0, false, fmt.Errorf("relay outbox: delete: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("relay outbox: commit: %w", err)
	}
	r.reportDead(ctx, schema, dead)
	return len(ids), false, nil
}

// readBatch locks and reads the first batchSize rows of the outbox, and
// returns their ids and records in order.
func readBatch(ctx context.Context, tx pgx.Tx) ([]int64, []pending, error) {
	rows, err := tx.Query(ctx, `SELECT id, topic, key, value, headers, created_at FROM outbox ORDER BY id LIMIT $1 FOR UPDATE`, batchSize)
	if err != nil {
		return nil, nil, fmt.Errorf("relay outbox: select: %w", err)
	}
	defer rows.Close()
	var (
		ids   []int64
		batch []pending
	)
	for rows.Next() {
		var (
			id      int64
			topics  []string
			keys    [][]byte
			values  [][]byte
			headers []map[string]string
			written time.Time
		)
		if err := rows.Scan(&id, &topics, &keys, &values, &headers, &written); err != nil {
			return nil, nil, fmt.Errorf("relay outbox: scan: %w", err)
		}
		if len(keys) != len(topics) || len(values) != len(topics) || len(headers) != len(topics) {
			return nil, nil, fmt.Errorf("relay outbox: row %d: %d topics, %d keys, %d values, %d headers", id, len(topics), len(keys), len(values), len(headers))
		}
		for i, topic := range topics {
			batch = append(batch, pending{row: id, written: written, headers: headers[i],
				record: &kgo.Record{Topic: topic, Key: keys[i], Value: values[i], Headers: recordHeaders(headers[i])}})
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("relay outbox: select: %w", err)
	}
	return ids, batch, nil
}

// publish produces batch and returns the records the log refused for good.
// Any other failure is returned as an error: the caller rolls back and
// tries the whole batch again, publishing its other records a second time,
// which idempotent consumers absorb.
//
// A broker refuses a whole produce batch and franz-go fails every record in
// it, so a refused record may only have shared a batch with a bad one. Each
// refused record is therefore produced again alone, in outbox order: alone
// it either goes through or is refused on its own account, and only then is
// it dead-lettered. The rest of its row is published either way.
//
// Order per key holds except around a refusal: a record produced again
// alone lands after the records of its batch that went through the first
// time, later records of its key among them, and a dead-lettered record
// leaves a gap in its key's sequence (requeued, it comes after everything
// written since). Consumers see such a record out of order, once.
func (r *Relay) publish(ctx context.Context, batch []pending) ([]deadRecord, error) {
	records := make([]*kgo.Record, len(batch))
	for i, p := range batch {
		records[i] = p.record
	}
	failed := map[*kgo.Record]bool{}
	for _, res := range r.producer.ProduceSync(ctx, records...) {
		switch {
		case res.Err == nil:
		case refused(res.Err):
			failed[res.Record] = true
		default:
			return nil, res.Err
		}
	}
	var dead []deadRecord
	for _, p := range batch {
		if !failed[p.record] {
			continue
		}
		alone := &kgo.Record{Topic: p.record.Topic, Key: p.record.Key, Value: p.record.Value, Headers: p.record.Headers}
		switch err := r.producer.ProduceSync(ctx, alone).FirstErr(); {
		case err == nil:
		case refused(err):
			dead = append(dead, deadRecord{pending: p, err: err})
		default:
			return nil, err
		}
	}
	return dead, nil
}

// bury moves dead records to outbox_dead in the relay's transaction.
func bury(ctx context.Context, tx pgx.Tx, dead []deadRecord) error {
	for _, d := range dead {
		headers, err := json.Marshal(d.headers)
		if err != nil {
			return fmt.Errorf("relay outbox: encode headers of a dead record of row %d: %w", d.row, err)
		}
		if d.headers == nil {
			headers = []byte("{}")
		}
		if _, err := tx.Exec(ctx, `
			INSERT INTO outbox_dead (outbox_id, topic, key, value, headers, error, written_at)
			VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)`,
			d.row, d.record.Topic, d.record.Key, d.record.Value, string(headers), d.err.Error(), d.written); err != nil {
			return fmt.Errorf("relay outbox: dead-letter a record of row %d: %w", d.row, err)
		}
	}
	return nil
}

// reportDead logs and counts the records a committed batch dead-lettered.
func (r *Relay) reportDead(ctx context.Context, schema string, dead []deadRecord) {
	if len(dead) == 0 {
		return
	}
	for _, d := range dead {
		r.log.ErrorContext(ctx, "the log refused an outbox record for good; moved to outbox_dead (flo outbox dead list)",
			"schema", schema, "outbox_id", d.row, "topic", d.record.Topic, "key", string(d.record.Key),
			"value_bytes", len(d.record.Value), "error", d.err)
	}
	r.dead.Add(ctx, int64(len(dead)), metric.WithAttributes(attribute.String("schema", schema)))
}

// recordHeaders turns a record's headers into log record headers, sorted by
// key so a record is published the same way every time.
func recordHeaders(headers map[string]string) []kgo.RecordHeader {
	keys := make([]string, 0, len(headers))
	for k := range headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]kgo.RecordHeader, len(keys))
	for i, k := range keys {
		out[i] = kgo.RecordHeader{Key: k, Value: []byte(headers[k])}
	}
	return out
}

// meterName names the meter of the outbox's instruments.
const meterName = "github.com/razorbill/flo/libs/outbox"

// backlog is what the outbox holds: records not yet published, and how long
// the oldest of them has waited.
type backlog struct {
	schema  string
	records int64
	oldest  time.Duration
}

// registerGauges reports the backlog through the global meter provider, so
// every service with an outbox reports it without wiring of its own.
func (r *Relay) registerGauges() (metric.Registration, error) {
	meter := otel.Meter(meterName)
	rows, err := meter.Int64ObservableGauge("flo.outbox.backlog", metric.WithUnit("{record}"),
		metric.WithDescription("Outbox records committed and not yet published to the log."))
	if err != nil {
		return nil, fmt.Errorf("create outbox backlog gauge: %w", err)
	}
	age, err := meter.Float64ObservableGauge("flo.outbox.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("How long the oldest unpublished outbox record has waited; 0 when the outbox is empty."))
	if err != nil {
		return nil, fmt.Errorf("create outbox age gauge: %w", err)
	}
	return telemetry.NewGauges(meter, telemetry.GaugeMaxAge, r.readBacklog, func(b backlog, o metric.Observer) {
		attrs := metric.WithAttributes(attribute.String("schema", b.schema))
		o.ObserveInt64(rows, b.records, attrs)
		o.ObserveFloat64(age, b.oldest.Seconds(), attrs)
	}, rows, age).Register()
}

// readBacklog counts the outbox in one statement; the relay keeps the table
// small, so the count is cheap unless publishing is stuck, which is when it
// matters.
func (r *Relay) readBacklog(ctx context.Context) (backlog, error) {
	var (
		b   backlog
		age float64
	)
	err := r.pool.QueryRow(ctx, `
		SELECT current_schema(), COALESCE(sum(cardinality(topic)), 0), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8
		FROM outbox`).Scan(&b.schema, &b.records, &age)
	if err != nil {
		return backlog{}, fmt.Errorf("read outbox backlog: %w", err)
	}
	b.oldest = time.Duration(age * float64(time.Second))
	return b, nil
}
