package devstack_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/services/devstack"
)

// traceOf waits until the trace holds a span named last, then returns the
// trace's spans. Spans end on their own schedule (the report's after its
// transaction, the workflow's after its advance), so the test waits for the
// last one it expects.
func traceOf(t *testing.T, rec *tracetest.SpanRecorder, id trace.TraceID, last string) []sdktrace.ReadOnlySpan {
	t.Helper()
	var spans []sdktrace.ReadOnlySpan
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		spans = spans[:0]
		found := false
		for _, s := range rec.Ended() {
			if s.SpanContext().TraceID() == id {
				spans = append(spans, s)
				found = found || s.Name() == last
			}
		}
		assert.True(c, found, "no span %q in the trace:\n%s", last, describe(spans))
	}, 30*time.Second, 20*time.Millisecond)
	return spans
}

// child returns the one span named name whose parent is parent.
func child(t *testing.T, spans []sdktrace.ReadOnlySpan, parent sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name && s.Parent().SpanID() == parent.SpanContext().SpanID() {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans %q under %q in the trace:\n%s", name, parent.Name(), describe(spans))
	require.Equal(t, parent.SpanContext().TraceID(), found[0].SpanContext().TraceID())
	return found[0]
}

// describe lists spans with their parents, for failure messages.
func describe(spans []sdktrace.ReadOnlySpan) string {
	names := map[trace.SpanID]string{}
	for _, s := range spans {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s <- %s\n", s.Name(), names[s.Parent().SpanID()])
	}
	return b.String()
}

// newTracedEnv starts a platform whose spans, and the test's own, go to the
// returned recorder, with a worker completing action, and connects a client.
func newTracedEnv(t *testing.T, action string) (*flo.Client, *tracetest.SpanRecorder) {
	t.Helper()
	return newTracedEnvWith(t, action, func(actx *flo.ActionContext) ([]byte, error) { return actx.Bytes("done") })
}

// newTracedEnvWith is newTracedEnv with handler running action.
func newTracedEnvWith(t *testing.T, action string, handler func(*flo.ActionContext) ([]byte, error)) (*flo.Client, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	e := newEnvWith(t, nil, devstack.WithSpanProcessor(rec))
	client := e.client(t, "default")
	_, err := client.RegisterAction(context.Background(), action, flo.ActionOptions{})
	require.NoError(t, err)
	e.worker(t, "default", flo.ActionWorkerOptions{}, func(w *flo.ActionWorker) { w.MustRegisterAction(action, handler) })
	return client, rec
}

// clientSpan starts the caller's own span, as an instrumented application
// has around its calls.
func clientSpan(name string) (context.Context, trace.Span) {
	return otel.Tracer("client").Start(context.Background(), name, trace.WithSpanKind(trace.SpanKindClient))
}

func TestOneTraceFollowsAnInvocationToItsCompletion(t *testing.T) {
	client, rec := newTracedEnv(t, "traced")
	ctx, span := clientSpan("client invoke")
	id, err := client.Invoke(ctx, "traced", map[string]string{"k": "v"})
	span.End()
	require.NoError(t, err)
	task, err := client.AwaitTask(context.Background(), id, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)

	// client -> gateway -> dispatcher intake -> worker handler -> completion.
	spans := traceOf(t, rec, span.SpanContext().TraceID(), "report completion")
	root := spanOf(t, spans, span)
	gateway := child(t, spans, root, "flo.v1.TaskService/InvokeTask")
	intake := child(t, spans, gateway, "enqueue traced")
	handler := child(t, spans, intake, "flo.action traced")
	for _, a := range []attribute.KeyValue{attribute.String("flo.task.id", id), attribute.String("flo.action", "traced"),
		attribute.Int("flo.task.attempt", 1), attribute.String("flo.namespace", "default")} {
		require.Contains(t, handler.Attributes(), a)
	}
	require.True(t, slices.ContainsFunc(handler.Attributes(), func(a attribute.KeyValue) bool {
		return a.Key == "flo.worker.id" && a.Value.AsString() != ""
	}), "the handler's span names its worker: %v", handler.Attributes())
	report := child(t, spans, handler, "report completion")
	require.Contains(t, report.Attributes(), attribute.Bool("flo.report.accepted", true))
}

// newTraceIDEnv starts a platform whose spans go to the returned recorder,
// with a worker of action that keeps, by payload, the trace id each task
// ran in, and connects a client.
func newTraceIDEnv(t *testing.T, action string) (*flo.Client, *tracetest.SpanRecorder, *sync.Map) {
	t.Helper()
	ran := &sync.Map{} // payload -> the handler's trace id
	client, rec := newTracedEnvWith(t, action, func(actx *flo.ActionContext) ([]byte, error) {
		ran.Store(string(actx.Payload()), trace.SpanContextFromContext(actx).TraceID())
		return nil, nil
	})
	return client, rec, ran
}

// The tasks of one InvokeMany call each run in the caller's trace: the
// gateway gives every command of the call its trace headers.
func TestABatchOfInvocationsRunsInItsCallersTrace(t *testing.T) {
	client, _, ran := newTraceIDEnv(t, "batched")
	ctx, span := clientSpan("client invoke many")
	payloads := make([]any, 5)
	for i := range payloads {
		payloads[i] = json.RawMessage(fmt.Sprintf(`"%d"`, i))
	}
	ids, err := client.InvokeMany(ctx, "batched", payloads)
	span.End()
	require.NoError(t, err)
	for _, id := range ids {
		task, err := client.AwaitTask(context.Background(), id, 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, flo.TaskCompleted, task.Status)
	}
	for _, p := range payloads {
		got, ok := ran.Load(string(p.(json.RawMessage)))
		require.True(t, ok, "the handler ran %s", p)
		require.Equal(t, span.SpanContext().TraceID(), got, "the task of %s ran in its caller's trace", p)
	}
}

// A stream record's handler span joins the trace of the append that wrote
// it and says which record, stream and group it handled.
func TestAStreamRecordIsHandledInItsAppendersTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	e := newEnvWith(t, nil, devstack.WithSpanProcessor(rec))
	client := e.client(t, "default")
	ctx := context.Background()
	_, err := client.CreateStream(ctx, "traced-orders", flo.StreamOptions{})
	require.NoError(t, err)
	_, err = client.CreateGroup(ctx, "traced-orders", "billing", flo.GroupOptions{})
	require.NoError(t, err)
	e.streamWorker(t, flo.StreamWorkerOptions{Stream: "traced-orders", Group: "billing"}, func(*flo.StreamContext) error { return nil })

	actx, span := clientSpan("client append")
	id, err := client.Append(actx, "traced-orders", map[string]string{"k": "v"})
	span.End()
	require.NoError(t, err)

	spans := traceOf(t, rec, span.SpanContext().TraceID(), "flo.stream traced-orders")
	var handler sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "flo.stream traced-orders" {
			handler = s
		}
	}
	for _, a := range []attribute.KeyValue{attribute.String("flo.record.id", id), attribute.Int("flo.record.delivery_count", 1),
		attribute.String("flo.stream", "traced-orders"), attribute.String("flo.stream.group", "billing"),
		attribute.String("flo.namespace", "default")} {
		require.Contains(t, handler.Attributes(), a)
	}
}

func TestOneTraceFollowsAWorkflowRunThroughItsStep(t *testing.T) {
	client, rec := newTracedEnv(t, "traced-step")
	_, _, err := client.CreateWorkflow(context.Background(), `kind: Workflow
name: traced-flow
version: "1"
start:
  run: "@actions/traced-step"
  transitions:
    success: flo.Completed
    failure: flo.Failed
`)
	require.NoError(t, err)

	ctx, span := clientSpan("client start run")
	started, err := client.StartWorkflow(ctx, "traced-flow", map[string]string{"k": "v"}, flo.StartWorkflowOptions{})
	span.End()
	require.NoError(t, err)
	run, err := client.AwaitRun(context.Background(), started.RunID)
	require.NoError(t, err)
	require.Equal(t, flo.RunCompleted, run.Status)

	// The run's start (through the gateway to the workflow service), the
	// step's task, its handler, the completion and the step advancing on it.
	spans := traceOf(t, rec, span.SpanContext().TraceID(), "advance run")
	root := spanOf(t, spans, span)
	gateway := child(t, spans, root, "flo.v1.WorkflowService/StartRun")
	// The gateway's client span of the internal call, then the workflow
	// service's server span, both named for the method by otelgrpc.
	call := child(t, spans, gateway, "flo.workflow.v1.Workflows/StartRun")
	start := child(t, spans, call, "flo.workflow.v1.Workflows/StartRun")
	intake := child(t, spans, start, "enqueue traced-step")
	handler := child(t, spans, intake, "flo.action traced-step")
	report := child(t, spans, handler, "report completion")
	advance := child(t, spans, report, "advance run")
	require.Contains(t, advance.Attributes(), attribute.String("flo.run_id", started.RunID))
}

// spanOf returns the recorded span of s.
func spanOf(t *testing.T, spans []sdktrace.ReadOnlySpan, s trace.Span) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, r := range spans {
		if r.SpanContext().SpanID() == s.SpanContext().SpanID() {
			return r
		}
	}
	t.Fatalf("span %s was not recorded", s.SpanContext().SpanID())
	return nil
}

// Invoke calls that overlap go to the gateway together (the SDK gathers
// them into InvokeTasks calls), and still each task runs in its own
// caller's trace; when the gateway refuses a gathered call for one item,
// only that item's caller gets the error.
func TestOverlappingInvokesGoTogetherAndKeepTheirCallersTraces(t *testing.T) {
	client, rec, ran := newTraceIDEnv(t, "each")

	// gathered reports whether the gateway answered an InvokeTasks call
	// with code (otelgrpc names codes as the gRPC specification does).
	gathered := func(code string) bool {
		for _, s := range rec.Ended() {
			if s.Name() == "flo.v1.TaskService/InvokeTasks" && slices.Contains(s.Attributes(), attribute.String("rpc.response.status_code", code)) {
				return true
			}
		}
		return false
	}
	const callers = 64
	wave := 0
	// invokeWave invokes from callers goroutines at once, each in a trace of
	// its own, and checks every outcome; the call numbered missing (when not
	// negative) names an action that does not exist.
	invokeWave := func(missing int) {
		wave++
		type call struct {
			payload string
			trace   trace.TraceID
			id      string
			err     error
		}
		calls := make([]call, callers)
		begin := make(chan struct{})
		var wg sync.WaitGroup
		for i := range calls {
			wg.Go(func() {
				ctx, span := clientSpan("caller")
				defer span.End()
				action := "each"
				if i == missing {
					action = "missing"
				}
				calls[i].payload = fmt.Sprintf(`"%d-%d"`, wave, i)
				calls[i].trace = span.SpanContext().TraceID()
				<-begin
				calls[i].id, calls[i].err = client.Invoke(ctx, action, json.RawMessage(calls[i].payload))
			})
		}
		close(begin)
		wg.Wait()
		for i, c := range calls {
			if i == missing {
				require.Equal(t, codes.NotFound, status.Code(c.err), "the call of an unknown action: %v", c.err)
				continue
			}
			require.NoError(t, c.err)
			task, err := client.AwaitTask(context.Background(), c.id, 30*time.Second)
			require.NoError(t, err)
			require.Equal(t, flo.TaskCompleted, task.Status)
			got, ok := ran.Load(c.payload)
			require.True(t, ok, "the handler ran %s", c.payload)
			require.Equal(t, c.trace, got, "the task of %s ran in its caller's trace", c.payload)
		}
	}
	for !gathered("OK") {
		require.Less(t, wave, 50, "no Invoke calls were ever sent together")
		invokeWave(-1)
	}
	for !gathered("NOT_FOUND") {
		require.Less(t, wave, 100, "no gathered call was ever refused for its unknown action")
		invokeWave(callers - 1)
	}
}
