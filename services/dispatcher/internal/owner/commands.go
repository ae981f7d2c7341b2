package owner

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/telemetry"
	"github.com/razorbill/flo/libs/text"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
)

var tracer = otel.Tracer("github.com/razorbill/flo/services/dispatcher/internal/owner")

// decodeInvocation reads one InvokeTask command. Its span continues the
// invoker's trace, and that span's context goes on the task, so the worker's
// handler span joins the same trace; traces makes that context. A command
// that does not decode, or whose ids and names are impossible, is an error:
// the caller dead-letters it.
func decodeInvocation(r *kgo.Record, traces *kafka.TraceMemo) (engine.Invocation, error) {
	var cmd eventsv1.InvokeTask
	// The generated decoder checks no UTF-8 (proto/codec); every string
	// kept is checked below.
	if err := cmd.UnmarshalVT(r.Value); err != nil {
		return engine.Invocation{}, fmt.Errorf("decode InvokeTask: %w", err)
	}
	id, err := uuid.Parse(cmd.GetTaskId())
	if err != nil {
		return engine.Invocation{}, fmt.Errorf("task_id %q: %w", cmd.GetTaskId(), err)
	}
	if err := text.Name("namespace", cmd.GetNamespace()); err != nil {
		return engine.Invocation{}, err
	}
	if err := text.Name("action", cmd.GetAction()); err != nil {
		return engine.Invocation{}, err
	}
	if err := text.Key("idempotency_key", cmd.GetIdempotencyKey()); err != nil {
		return engine.Invocation{}, err
	}
	if err := text.Storable("origin", cmd.GetOrigin()); err != nil {
		return engine.Invocation{}, err
	}
	inv := engine.Invocation{
		TaskID:         id,
		Namespace:      cmd.GetNamespace(),
		Action:         cmd.GetAction(),
		Payload:        cmd.GetPayload(),
		IdempotencyKey: cmd.GetIdempotencyKey(),
		Priority:       cmd.GetPriority(),
		Origin:         cmd.GetOrigin(),
		MaxAttempts:    cmd.GetMaxAttempts(),
		InvokedAt:      r.Timestamp,
	}
	if cmd.GetInvokedAt().IsValid() {
		inv.InvokedAt = cmd.GetInvokedAt().AsTime()
	}
	if inv.InvokedAt.IsZero() {
		inv.InvokedAt = time.Now()
	}
	if cmd.GetRunAt().IsValid() {
		inv.RunAt = cmd.GetRunAt().AsTime()
	}
	// While nothing records spans, a span under a valid parent would be no
	// span (telemetry's pass-through): its name and attributes, made for
	// every task, are skipped, and the parent's context goes on as it would.
	ctx := context.Background()
	if !telemetry.Recording() {
		if inv.TraceContext = traces.Valid(r); inv.TraceContext != nil {
			return inv, nil
		}
		// No valid context: the span starts a trace.
	} else {
		ctx = kafka.ExtractTrace(ctx, r)
	}
	ctx, span := tracer.Start(ctx, "enqueue "+inv.Action,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("flo.task_id", inv.TaskID.String()),
			attribute.String("flo.namespace", inv.Namespace),
			attribute.String("flo.action", inv.Action),
		))
	defer span.End()
	inv.TraceContext = kafka.TraceHeaders(ctx)
	return inv, nil
}

// movedHeader marks a command that the owner of the partition it was sent
// to moved to its task's partition; its value is the partition it came from.
const movedHeader = "flo-moved-from"

// moveCommand returns rec, a command sent to partition from for a task of
// partition to, as a record of partition to, keyed by the task's id and
// marked moved. Its bytes are copies: rec's go back to the fetch pool.
func moveCommand(rec *kgo.Record, taskID string, from, to int32) *kgo.Record {
	headers := make([]kgo.RecordHeader, 0, len(rec.Headers)+1)
	for _, h := range rec.Headers {
		if h.Key != movedHeader {
			headers = append(headers, kgo.RecordHeader{Key: h.Key, Value: bytes.Clone(h.Value)})
		}
	}
	headers = append(headers, kgo.RecordHeader{Key: movedHeader, Value: strconv.AppendInt(nil, int64(from), 10)})
	return &kgo.Record{Topic: kafka.CommandsTopic, Partition: to, Key: []byte(taskID), Value: bytes.Clone(rec.Value), Headers: headers}
}

// wasMoved reports whether rec is a command another partition's owner moved
// here (moveCommand).
func wasMoved(rec *kgo.Record) bool {
	for _, h := range rec.Headers {
		if h.Key == movedHeader {
			return true
		}
	}
	return false
}

// reportSpanNames name a report's span by its kind.
var reportSpanNames = map[engine.Kind]string{
	engine.Complete: "report completion",
	engine.Fail:     "report failure",
	engine.Nack:     "report nack",
	engine.Abandon:  "report abandon",
	engine.Pending:  "report pending",
}

// startReportSpans starts a span for each report that carries its worker's
// handler span, as that span's child, and puts the new span's context on
// the report: the events it causes carry it, so whatever waits on the task
// (a workflow step) continues the trace from the report. While nothing
// records spans the report's own context goes on as it came: a span not
// made would carry the same one.
func startReportSpans(ctx context.Context, reps []engine.Report) []trace.Span {
	if !telemetry.Recording() {
		return nil
	}
	spans := make([]trace.Span, len(reps))
	for i, rep := range reps {
		if len(rep.TraceContext) == 0 {
			continue
		}
		sctx, span := tracer.Start(kafka.ContextFromHeaders(ctx, rep.TraceContext), reportSpanNames[rep.Kind],
			trace.WithAttributes(
				attribute.String("flo.task.id", rep.TaskID),
				attribute.Int("flo.task.attempt", int(rep.Attempt)),
			))
		spans[i] = span
		reps[i].TraceContext = kafka.TraceHeaders(sctx)
	}
	return spans
}

// endReportSpans ends the spans once the reports were recorded (err nil)
// or not; ok says which reports matched a running attempt.
func endReportSpans(spans []trace.Span, ok []bool, err error) {
	for i, span := range spans {
		if span == nil {
			continue
		}
		span.SetAttributes(attribute.Bool("flo.report.accepted", err == nil && i < len(ok) && ok[i]))
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, "report not applied")
		}
		span.End()
	}
}
