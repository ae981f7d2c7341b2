package intake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/text"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
)

// CommandsTopic carries InvokeTask commands.
const CommandsTopic = "flo.actions.commands"

// ConsumerGroup is the dispatcher's consumer group on CommandsTopic.
const ConsumerGroup = "flo-dispatcher"

var tracer = otel.Tracer("github.com/razorbill/flo/services/dispatcher/internal/intake")

// HandleRecords is the kafka.BatchHandler for CommandsTopic. Each valid record
// gets a span continuing the invoker's trace; that span's context is stored
// on the task so the worker's handler span joins the same trace. A record
// that does not decode, or whose ids and names are impossible, is returned
// as kafka.Poison once the others are enqueued: the consumer dead-letters it
// without enqueueing the batch again.
func (in *Intake) HandleRecords(ctx context.Context, records []*kgo.Record) error {
	invs := make([]Invocation, 0, len(records))
	spans := make([]trace.Span, 0, len(records))
	var poison []error
	for _, r := range records {
		inv, err := decode(r)
		if err != nil {
			poison = append(poison, kafka.Poison(r, err))
			continue
		}
		rctx, span := tracer.Start(kafka.ExtractTrace(ctx, r), "enqueue "+inv.Action,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(taskAttrs(inv)...))
		inv.TraceContext = kafka.TraceHeaders(rctx)
		invs = append(invs, inv)
		spans = append(spans, span)
	}
	err := in.Enqueue(ctx, invs)
	for _, s := range spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, "enqueue failed")
		}
		s.End()
	}
	if err != nil {
		return err
	}
	return errors.Join(poison...)
}

func decode(r *kgo.Record) (Invocation, error) {
	var cmd eventsv1.InvokeTask
	if err := proto.Unmarshal(r.Value, &cmd); err != nil {
		return Invocation{}, fmt.Errorf("decode InvokeTask: %w", err)
	}
	id, err := uuid.Parse(cmd.GetTaskId())
	if err != nil {
		return Invocation{}, fmt.Errorf("task_id %q: %w", cmd.GetTaskId(), err)
	}
	if err := text.Name("namespace", cmd.GetNamespace()); err != nil {
		return Invocation{}, err
	}
	if err := text.Name("action", cmd.GetAction()); err != nil {
		return Invocation{}, err
	}
	if err := text.Key("idempotency_key", cmd.GetIdempotencyKey()); err != nil {
		return Invocation{}, err
	}
	inv := Invocation{
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
	return inv, nil
}

func taskAttrs(inv Invocation) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("flo.task_id", inv.TaskID.String()),
		attribute.String("flo.namespace", inv.Namespace),
		attribute.String("flo.action", inv.Action),
	}
}
