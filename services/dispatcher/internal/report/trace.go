package report

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
)

var tracer = otel.Tracer("github.com/razorbill/flo/services/dispatcher/internal/report")

// spanNames name a report's span by its kind.
var spanNames = map[Kind]string{
	Complete: "report completion",
	Fail:     "report failure",
	Nack:     "report nack",
	Abandon:  "report abandon",
}

// startSpans starts a span for each report that carries its worker's handler
// span, as that span's child, and keeps the new span's context on the entry:
// the events the report causes carry it, so whatever waits on the task (a
// workflow step) continues the trace from the report.
func startSpans(ctx context.Context, entries []entry) {
	for i, e := range entries {
		if len(e.report.TraceContext) == 0 {
			continue
		}
		sctx, span := tracer.Start(kafka.ContextFromHeaders(ctx, e.report.TraceContext), spanNames[e.report.Kind],
			trace.WithAttributes(
				attribute.String("flo.task.id", e.report.TaskID),
				attribute.Int("flo.task.attempt", int(e.report.Attempt)),
			))
		entries[i].span = span
		entries[i].traceHeaders = kafka.TraceHeaders(sctx)
	}
}

// endSpans ends the entries' spans once their transaction is over; err is
// its error.
func endSpans(entries []entry, err error) {
	for _, e := range entries {
		if e.span == nil {
			continue
		}
		e.span.SetAttributes(attribute.Bool("flo.report.accepted", e.accepted && err == nil))
		if err != nil {
			e.span.RecordError(err)
			e.span.SetStatus(codes.Error, "report not applied")
		}
		e.span.End()
	}
}

// traced returns c carrying headers, when there are some, for the events it
// causes.
func traced(c store.Change, headers map[string]string) store.Change {
	if headers != nil {
		c.TraceContext = headers
	}
	return c
}
