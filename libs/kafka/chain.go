package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/retry"
	"github.com/razorbill/flo/libs/telemetry"
)

// The handler chain follows Watermill's handler middleware: each concern
// (recovering from panics, continuing traces, retrying what another try can
// fix) wraps the next one, and the consumer or tail puts isolation around
// the whole, since only it knows where a record it cannot handle goes.

// middleware wraps a BatchHandler with one concern.
type middleware func(BatchHandler) BatchHandler

// transientRetry is how a batch that failed for a transient reason is tried
// again: until it succeeds or the consumer stops.
var transientRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}

// maxTraceLinks bounds the links of a batch span to the SDK's default link
// limit: more would be dropped anyway.
const maxTraceLinks = 128

var tracer = otel.Tracer("github.com/razorbill/flo/libs/kafka")

// newChain wraps h with the middleware every consumer and tail runs: a span
// continuing the records' traces around every attempt, transient failures
// retried, panics turned into errors.
func newChain(h BatchHandler, log *slog.Logger) BatchHandler {
	for _, m := range []middleware{recovering(log), retrying(log), tracing} {
		h = m(h)
	}
	return h
}

// recovering turns a panic of the handler into an error, logging its stack:
// a record that makes the handler panic is isolated like any other failure
// instead of taking the process down.
func recovering(log *slog.Logger) middleware {
	return func(next BatchHandler) BatchHandler {
		return func(ctx context.Context, records []*kgo.Record) (err error) {
			defer func() {
				if v := recover(); v != nil {
					first := records[0]
					log.ErrorContext(ctx, "record handler panicked", "topic", first.Topic, "partition", first.Partition,
						"first_offset", first.Offset, "records", len(records), "panic", v, "stack", string(debug.Stack()))
					err = fmt.Errorf("handler panicked: %v", v)
				}
			}()
			return next(ctx, records)
		}
	}
}

// retrying calls next again with backoff for as long as it fails with a
// transient error, so a lost connection or a lost serialization race never
// isolates a record; any other error is returned at once.
func retrying(log *slog.Logger) middleware {
	return func(next BatchHandler) BatchHandler {
		return func(ctx context.Context, records []*kgo.Record) error {
			return retry.Do(ctx, transientRetry, func() error {
				err := next(ctx, records)
				if err == nil || (ctx.Err() == nil && IsTransient(err)) {
					return err
				}
				return retry.Permanent(err)
			}, func(err error, attempt int, wait time.Duration) {
				first, last := records[0], records[len(records)-1]
				log.WarnContext(ctx, "handle records failed transiently; retrying",
					"topic", first.Topic, "partition", first.Partition, "first_offset", first.Offset, "last_offset", last.Offset,
					"attempt", attempt, "retry_in", wait, "error", err)
			})
		}
	}
}

// tracing runs next in a consumer span. One record's span continues that
// record's trace; a batch's span links the traces of its records, since a
// span has one parent.
func tracing(next BatchHandler) BatchHandler {
	return func(ctx context.Context, records []*kgo.Record) error {
		first := records[0]
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.String("messaging.system", "kafka"),
				attribute.String("messaging.destination.name", first.Topic),
				attribute.Int("messaging.destination.partition.id", int(first.Partition)),
				attribute.Int("messaging.batch.message_count", len(records))),
		}
		if len(records) == 1 {
			ctx = ExtractTrace(ctx, first)
		} else if telemetry.Recording() {
			// Reading up to 128 records' trace contexts cost 2% of a loaded
			// process, for links nothing would see.
			for _, r := range records[:min(len(records), maxTraceLinks)] {
				if sc := trace.SpanContextFromContext(ExtractTrace(context.Background(), r)); sc.IsValid() {
					opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
				}
			}
		}
		ctx, span := tracer.Start(ctx, "process "+first.Topic, opts...)
		defer span.End()
		err := next(ctx, records)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "handle records failed")
		}
		return err
	}
}

// IsTransient reports whether another try may succeed where err failed,
// with nothing about the records changed: the connection to Postgres or the
// broker was lost or refused, Postgres is shutting down or out of
// connections or other resources, the transaction lost a serialization race,
// a deadlock or a lock wait, or one attempt ran out of time.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	// Not reaching Postgres at all (down, refusing, a rotated password) is
	// never the records' fault, whatever the server answered.
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", // serialization_failure
			"40P01", // deadlock_detected
			"55P03", // lock_not_available
			"57014", // query_canceled: a statement timeout
			"57P01", // admin_shutdown
			"57P02", // crash_shutdown
			"57P03": // cannot_connect_now
			return true
		}
		// connection_exception; insufficient_resources (too many
		// connections, disk full, out of memory).
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "53")
	}
	var (
		netErr   net.Error
		kafkaErr *kerr.Error
	)
	switch {
	case pgconn.SafeToRetry(err), pgconn.Timeout(err), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded):
		return true
	case errors.As(err, &kafkaErr):
		return kafkaErr.Retriable
	}
	return false
}

// PoisonError says a record can never be handled: it does not decode, or
// what it says is impossible. Make one with Poison.
type PoisonError struct {
	Record *kgo.Record
	Err    error
}

// Error names the record and why it is poison.
func (e *PoisonError) Error() string {
	return fmt.Sprintf("record %s/%d@%d: %v", e.Record.Topic, e.Record.Partition, e.Record.Offset, e.Err)
}

// Unwrap returns why the record is poison.
func (e *PoisonError) Unwrap() error { return e.Err }

// Poison marks r as a record that no retry can make its handler accept.
//
// A BatchHandler that returns only Poison errors (one, or several joined
// with errors.Join) says it handled every other record of the batch: the
// poisoned records are isolated (dead-lettered by a Consumer, skipped by a
// Tail) and the partition moves on, without the batch being run again. Any
// other error means none of the batch counts as handled.
func Poison(r *kgo.Record, err error) error { return &PoisonError{Record: r, Err: err} }

// poisonedIn returns the poison errors err is made of, when err is made of
// nothing else and each names a record of records.
func poisonedIn(err error, records []*kgo.Record) ([]*PoisonError, bool) {
	var out []*PoisonError
	var walk func(error) bool
	walk = func(e error) bool {
		switch x := e.(type) {
		case *PoisonError:
			out = append(out, x)
			return true
		case interface{ Unwrap() []error }:
			for _, m := range x.Unwrap() {
				if !walk(m) {
					return false
				}
			}
			return true
		case interface{ Unwrap() error }:
			if u := x.Unwrap(); u != nil {
				return walk(u)
			}
		}
		return false
	}
	if !walk(err) || len(out) == 0 {
		return nil, false
	}
	for _, p := range out {
		if !contains(records, p.Record) {
			return nil, false
		}
	}
	return out, true
}

func contains(records []*kgo.Record, r *kgo.Record) bool {
	for _, x := range records {
		if x.Topic == r.Topic && x.Partition == r.Partition && x.Offset == r.Offset {
			return true
		}
	}
	return false
}

type isolatedKey struct{}

// Isolated reports whether the consumer runs this call to find the record a
// failed batch cannot get past. The handler must then do the call's work on
// its own, not in a transaction shared with other calls (the batches of
// other partitions): otherwise a bad record of another partition would fail
// this call too, and a good record would be dead-lettered in its place.
func Isolated(ctx context.Context) bool {
	v, _ := ctx.Value(isolatedKey{}).(bool)
	return v
}

// reject is what happens to a record that failed alone: it is dead-lettered
// or skipped. It reports false when ctx ended before that was done.
type reject func(ctx context.Context, r *kgo.Record, cause error) bool

// isolator runs a partition's batch through the chain and isolates what
// fails for a reason other than a transient one.
type isolator struct {
	h      BatchHandler
	reject reject
	log    *slog.Logger
}

// handle runs records through the chain until each is handled or rejected,
// in three steps: the batch as the consumer polled it (possibly sharing a
// transaction with other partitions), then the batch Isolated (its own
// transaction), then each record Isolated on its own. A record that fails
// alone, or that the handler calls poison, is rejected. It reports false
// when ctx ended first: nothing may then be committed.
func (is *isolator) handle(ctx context.Context, records []*kgo.Record) bool {
	err := is.h(ctx, records)
	if done, ok := is.settled(ctx, records, err); done {
		return ok
	}
	first := records[0]
	is.log.WarnContext(ctx, "handle records failed; running them isolated", "topic", first.Topic, "partition", first.Partition,
		"first_offset", first.Offset, "records", len(records), "error", err)
	alone := context.WithValue(ctx, isolatedKey{}, true)
	err = is.h(alone, records)
	done, ok := is.settled(ctx, records, err)
	switch {
	case done:
		return ok
	case len(records) == 1:
		return is.reject(ctx, first, err)
	}
	for _, r := range records {
		one := []*kgo.Record{r}
		err := is.h(alone, one)
		if done, ok := is.settled(ctx, one, err); done {
			if !ok {
				return false
			}
			continue
		}
		if !is.reject(ctx, r, err) {
			return false
		}
	}
	return true
}

// settled reports whether err ends the handling of records (done), and if
// so whether they all count as handled (ok): they succeeded, ctx ended (not
// handled), or only poison records failed (rejected, the rest handled).
func (is *isolator) settled(ctx context.Context, records []*kgo.Record, err error) (done, ok bool) {
	if err == nil {
		return true, true
	}
	if ctx.Err() != nil {
		return true, false
	}
	poisoned, only := poisonedIn(err, records)
	if !only {
		return false, false
	}
	for _, p := range poisoned {
		if !is.reject(ctx, p.Record, p.Err) {
			return true, false
		}
	}
	return true, true
}
