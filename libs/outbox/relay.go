package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

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
	retryMin  = 100 * time.Millisecond
	retryMax  = 5 * time.Second
	// flushPoll is how often Flush looks whether the outbox is empty yet.
	flushPoll = 20 * time.Millisecond
)

// Relay publishes committed outbox rows in id order and deletes them.
type Relay struct {
	pool     *pgxpool.Pool
	producer *kgo.Client
	log      *slog.Logger
	wake     chan struct{}
}

// NewRelay returns a relay for the outbox table of pool's schema (the pool's
// search_path, as set by pg.Connect) that publishes through producer.
//
// Rows are published in batches of up to 500 per transaction; a batch is
// produced synchronously, then deleted, then committed. Only one relay per
// schema works at a time (pg_try_advisory_xact_lock), so rows of one key keep
// their order across replicas. A produce failure rolls back (the rows stay)
// and retries with backoff.
func NewRelay(pool *pgxpool.Pool, producer *kgo.Client, log *slog.Logger) *Relay {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Relay{pool: pool, producer: producer, log: log, wake: make(chan struct{}, 1)}
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
// flo.outbox.backlog and flo.outbox.oldest_age, by schema.
func (r *Relay) Run(ctx context.Context) error {
	if reg, err := r.registerGauges(); err != nil {
		r.log.WarnContext(ctx, "outbox gauges not reported", "error", err)
	} else {
		defer func() { _ = reg.Unregister() }()
	}
	poll := time.NewTicker(pollInterval)
	defer poll.Stop()
	delay := retryMin
	for {
		moved, busy, err := r.relayBatch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var wait <-chan time.Time
		switch {
		case err != nil:
			r.log.WarnContext(ctx, "relay outbox failed; retrying", "retry_in", delay, "error", err)
			wait = time.After(delay)
			delay = min(delay*2, retryMax)
		case moved == batchSize:
			// A full batch: there is probably more right now.
			delay = retryMin
			continue
		case busy:
			delay = retryMin
			wait = time.After(busyRetry)
		default:
			delay = retryMin
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

// relayBatch publishes and deletes up to batchSize rows in one transaction.
// busy reports that another relay holds the schema's lock.
func (r *Relay) relayBatch(ctx context.Context) (moved int, busy bool, err error) {
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("relay outbox: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var locked bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.outbox'))`).Scan(&locked); err != nil {
		return 0, false, fmt.Errorf("relay outbox: lock: %w", err)
	}
	if !locked {
		return 0, true, nil
	}
	rows, err := tx.Query(ctx, `SELECT id, topic, key, value, headers FROM outbox ORDER BY id LIMIT $1 FOR UPDATE`, batchSize)
	if err != nil {
		return 0, false, fmt.Errorf("relay outbox: select: %w", err)
	}
	var (
		ids     []int64
		records []*kgo.Record
	)
	for rows.Next() {
		var (
			id      int64
			topics  []string
			keys    [][]byte
			values  [][]byte
			headers []map[string]string
		)
		if err := rows.Scan(&id, &topics, &keys, &values, &headers); err != nil {
			rows.Close()
			return 0, false, fmt.Errorf("relay outbox: scan: %w", err)
		}
		if len(keys) != len(topics) || len(values) != len(topics) || len(headers) != len(topics) {
			rows.Close()
			return 0, false, fmt.Errorf("relay outbox: row %d: %d topics, %d keys, %d values, %d headers", id, len(topics), len(keys), len(values), len(headers))
		}
		for i, topic := range topics {
			records = append(records, &kgo.Record{Topic: topic, Key: keys[i], Value: values[i], Headers: recordHeaders(headers[i])})
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return 0, false, fmt.Errorf("relay outbox: select: %w", err)
	}
	if len(ids) == 0 {
		return 0, false, nil
	}
	if err := r.producer.ProduceSync(ctx, records...).FirstErr(); err != nil {
		return 0, false, fmt.Errorf("relay outbox: produce %d records of %d rows: %w", len(records), len(ids), err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = ANY($1)`, ids); err != nil {
		return 0, false, fmt.Errorf("relay outbox: delete: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("relay outbox: commit: %w", err)
	}
	return len(ids), false, nil
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
	meter := otel.Meter("github.com/razorbill/flo/libs/outbox")
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
