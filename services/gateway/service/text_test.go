package service_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/razorbill/flo/libs/text"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// startFullStack starts every service behind the gateway.
func startFullStack(t *testing.T) *stack {
	t.Helper()
	return newStack(t, stackOptions{registry: true, streams: true, workflow: true})
}

// textCase is one client text field sent with a NUL in it, over REST and
// over gRPC. An empty field means the text is free text, accepted and stored
// cleaned; otherwise the call is refused with InvalidArgument (HTTP 400)
// naming field.
type textCase struct {
	name   string
	field  string
	method string
	path   string
	body   any
	call   func(ctx context.Context) error
}

const (
	nul       = "a\x00b"
	anyRunID  = "0b9c7f5e-8a4a-4d57-9d0e-4f7f7f2b9d11"
	eventsURL = "/v1/namespaces/default/streams/events"
)

// textCases lists every text field a client sends on the public API, each
// with a NUL; s has the action "known", the stream "events" with group "g",
// and the workflow process-order.
func textCases(s *stack) []textCase {
	action := map[string]any{"workerId": "w-ok", "workerType": "WORKER_TYPE_ACTION"}
	with := func(k string, v any) map[string]any {
		m := maps.Clone(action)
		m[k] = v
		return m
	}
	longKey := strings.Repeat("k", text.MaxKeyBytes+1)
	return []textCase{
		{"namespace name", "name", http.MethodPost, "/v1/namespaces", map[string]any{"name": nul}, func(ctx context.Context) error {
			_, err := s.namespaces.CreateNamespace(ctx, &flov1.CreateNamespaceRequest{Name: nul})
			return err
		}},
		{"namespace of a call", "namespace", http.MethodGet, "/v1/namespaces/a%00b/actions", nil, func(ctx context.Context) error {
			_, err := s.actions.ListActions(ctx, &flov1.ListActionsRequest{Namespace: nul})
			return err
		}},
		{"action name", "name", http.MethodPost, "/v1/namespaces/default/actions", map[string]any{"name": nul}, func(ctx context.Context) error {
			_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "default", Name: nul})
			return err
		}},
		{"invoked action", "action", http.MethodPost, "/v1/namespaces/default/actions/a%00b/invoke", map[string]any{}, func(ctx context.Context) error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: nul})
			return err
		}},
		{"idempotency key", "idempotency_key", http.MethodPost, "/v1/namespaces/default/actions/known/invoke", map[string]any{"idempotencyKey": nul}, func(ctx context.Context) error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: "known", IdempotencyKey: nul})
			return err
		}},
		{"idempotency key over 256 bytes", "idempotency_key is 257 bytes", http.MethodPost, "/v1/namespaces/default/actions/known/invoke", map[string]any{"idempotencyKey": longKey}, func(ctx context.Context) error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: "known", IdempotencyKey: longKey})
			return err
		}},
		{"delay over 365 days", "delay_ms must be between 0 and 31536000000", http.MethodPost, "/v1/namespaces/default/actions/known/invoke", map[string]any{"delayMs": 31536000001}, func(ctx context.Context) error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: "known", DelayMs: math.MaxInt64})
			return err
		}},
		{"batch item idempotency key", "tasks[1]: idempotency_key", http.MethodPost, "/v1/namespaces/default/tasks:invoke",
			map[string]any{"tasks": []any{map[string]any{"action": "known"}, map[string]any{"action": "known", "idempotencyKey": nul}}}, func(ctx context.Context) error {
				_, err := s.tasks.InvokeTasks(ctx, &flov1.InvokeTasksRequest{Namespace: "default", Tasks: []*flov1.InvokeTaskRequest{{Action: "known"}, {Action: "known", IdempotencyKey: nul}}})
				return err
			}},
		{"task id", "task_id", http.MethodGet, "/v1/namespaces/default/tasks/a%00b", nil, func(ctx context.Context) error {
			_, err := s.tasks.GetTask(ctx, &flov1.GetTaskRequest{Namespace: "default", TaskId: nul})
			return err
		}},
		{"registered worker id", "worker_id", http.MethodPost, "/v1/namespaces/default/workers", with("workerId", nul), func(ctx context.Context) error {
			_, err := s.registry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{Namespace: "default", WorkerId: nul, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION})
			return err
		}},
		{"machine id", "machine_id", http.MethodPost, "/v1/namespaces/default/workers", with("machineId", nul), func(ctx context.Context) error {
			_, err := s.registry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{Namespace: "default", WorkerId: "w-ok", MachineId: nul, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION})
			return err
		}},
		{"metadata", "metadata", http.MethodPost, "/v1/namespaces/default/workers", with("metadata", `{"a":"`+nul+`"}`), func(ctx context.Context) error {
			_, err := s.registry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{Namespace: "default", WorkerId: "w-ok", Metadata: `{"a":"\u0000"}`, WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION})
			return err
		}},
		{"heartbeat worker id", "worker_id", http.MethodPost, "/v1/namespaces/default/workers/a%00b/heartbeat", map[string]any{}, func(ctx context.Context) error {
			_, err := s.registry.Heartbeat(ctx, &flov1.HeartbeatRequest{Namespace: "default", WorkerId: nul})
			return err
		}},
		{"stream name", "name", http.MethodPost, "/v1/namespaces/default/streams", map[string]any{"name": nul}, func(ctx context.Context) error {
			_, err := s.streams.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: "default", Name: nul})
			return err
		}},
		{"appended-to stream", "stream", http.MethodPost, "/v1/namespaces/default/streams/a%00b/records", map[string]any{"records": []any{map[string]any{"value": 1}}}, func(ctx context.Context) error {
			_, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: "default", Stream: nul, Records: []*flov1.AppendRecord{{Payload: []byte(`1`)}}})
			return err
		}},
		{"group name", "name", http.MethodPost, eventsURL + "/groups", map[string]any{"name": nul}, func(ctx context.Context) error {
			_, err := s.streams.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: "default", Stream: "events", Name: nul})
			return err
		}},
		{"group of a read", "group", http.MethodPost, eventsURL + "/groups/a%00b/read", map[string]any{"consumer": "c1"}, func(ctx context.Context) error {
			_, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: nul, Consumer: "c1"})
			return err
		}},
		{"consumer", "consumer", http.MethodPost, eventsURL + "/groups/g/read", map[string]any{"consumer": nul}, func(ctx context.Context) error {
			_, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: "g", Consumer: nul})
			return err
		}},
		{"pending consumer filter", "consumer", http.MethodGet, eventsURL + "/groups/g/pending?consumer=a%00b", nil, func(ctx context.Context) error {
			_, err := s.streams.ListPending(ctx, &flov1.ListPendingRequest{Namespace: "default", Stream: "events", Group: "g", Consumer: nul})
			return err
		}},
		{"record id", "record id", http.MethodPost, eventsURL + "/groups/g/ack", map[string]any{"ids": []string{nul}}, func(ctx context.Context) error {
			_, err := s.streams.Ack(ctx, &flov1.AckRequest{Namespace: "default", Stream: "events", Group: "g", Ids: []string{nul}})
			return err
		}},
		{"workflow definition", "", http.MethodPost, "/v1/namespaces/default/workflows", map[string]any{"yaml": "kind: Workflow\nname: " + nul + "\n"}, func(ctx context.Context) error {
			_, err := s.workflows.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Namespace: "default", Yaml: "kind: Workflow\nname: " + nul + "\n"})
			return err
		}},
		{"started workflow", "workflow", http.MethodPost, "/v1/namespaces/default/workflows/a%00b/runs", map[string]any{"idempotencyKey": "k"}, func(ctx context.Context) error {
			_, err := s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: nul, IdempotencyKey: "k"})
			return err
		}},
		{"run idempotency key", "idempotency_key", http.MethodPost, "/v1/namespaces/default/workflows/process-order/runs", map[string]any{"idempotencyKey": nul}, func(ctx context.Context) error {
			_, err := s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "process-order", IdempotencyKey: nul})
			return err
		}},
		{"signal type", "type", http.MethodPost, "/v1/namespaces/default/runs/" + anyRunID + "/signals", map[string]any{"type": nul}, func(ctx context.Context) error {
			_, err := s.workflows.SignalRun(ctx, &flov1.SignalRunRequest{Namespace: "default", RunId: anyRunID, Type: nul})
			return err
		}},
		{"run id", "run_id", http.MethodGet, "/v1/namespaces/default/runs/a%00b", nil, func(ctx context.Context) error {
			_, err := s.workflows.GetRun(ctx, &flov1.GetRunRequest{Namespace: "default", RunId: nul})
			return err
		}},
	}
}

// TestNULInEveryClientTextField sends a NUL in each text field of the public
// API over REST and gRPC: identifiers and keys are refused with
// InvalidArgument naming the field and change nothing; then free text (a
// stream nack reason, a cancel reason, a record key) is accepted and stored
// cleaned, and ordinary calls still work.
func TestNULInEveryClientTextField(t *testing.T) {
	s := startFullStack(t)
	ctx := testContext(t)
	_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "default", Name: "known"})
	require.NoError(t, err)
	createStreamAndGroup(t, s, "events", "g")
	_, err = s.workflows.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Namespace: "default", Yaml: processOrderYAML(t)})
	require.NoError(t, err)

	for _, tc := range textCases(s) {
		t.Run("REST "+tc.name, func(t *testing.T) {
			resp := s.rest(t, tc.method, tc.path, tc.body)
			require.Equal(t, http.StatusBadRequest, resp.status, "%s", resp.raw)
			require.EqualValues(t, codes.InvalidArgument, resp.body["code"], "%s", resp.raw)
			require.Contains(t, resp.body["message"], tc.field)
		})
		t.Run("gRPC "+tc.name, func(t *testing.T) {
			err := tc.call(testContext(t))
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Contains(t, status.Convert(err).Message(), tc.field)
		})
	}

	// Nothing the refused calls named was created.
	actions, err := s.actions.ListActions(ctx, &flov1.ListActionsRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Len(t, actions.GetActions(), 1)
	require.Empty(t, commandKeys(t, s.brokers))

	// Free text is accepted and stored cleaned: a record key, a stream nack
	// reason over REST and gRPC, a cancel reason.
	_, err = s.streams.Append(ctx, &flov1.AppendRequest{Namespace: "default", Stream: "events", Records: []*flov1.AppendRecord{
		{Payload: []byte(`1`), Key: nul, Headers: map[string]string{"h": nul}},
		{Payload: []byte(`2`)},
	}})
	require.NoError(t, err)
	read, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: "g", Consumer: "c1", Count: 2})
	require.NoError(t, err)
	require.Len(t, read.GetRecords(), 2)
	nacked := s.rest(t, http.MethodPost, eventsURL+"/groups/g/nack", map[string]any{"ids": []string{read.GetRecords()[0].GetId()}, "reason": nul})
	require.Equal(t, http.StatusOK, nacked.status, "%s", nacked.raw)
	n, err := s.streams.Nack(ctx, &flov1.NackRequest{Namespace: "default", Stream: "events", Group: "g", Ids: []string{read.GetRecords()[1].GetId()}, Reason: nul})
	require.NoError(t, err)
	require.EqualValues(t, 1, n.GetNacked())
	var again []*flov1.StreamRecord
	require.Eventually(t, func() bool {
		r, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: "g", Consumer: "c2", Count: 2})
		require.NoError(t, err)
		again = append(again, r.GetRecords()...)
		return len(again) == 2
	}, wait, 10*time.Millisecond, "the nacked records never came back")

	// A nack delay past what a duration holds is capped, not misread.
	n, err = s.streams.Nack(ctx, &flov1.NackRequest{Namespace: "default", Stream: "events", Group: "g", Ids: []string{again[0].GetId()}, DelayMs: math.MaxInt64})
	require.NoError(t, err)
	require.EqualValues(t, 1, n.GetNacked())

	run, err := s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "process-order", IdempotencyKey: "order-1", Input: []byte(`{"a":"\u0000"}`)})
	require.NoError(t, err)
	cancelled := s.rest(t, http.MethodPost, "/v1/namespaces/default/runs/"+run.GetRunId()+"/cancel", map[string]any{"reason": nul})
	require.Equal(t, http.StatusOK, cancelled.status, "%s", cancelled.raw)
	hist, err := s.workflows.GetRunHistory(ctx, &flov1.GetRunRequest{Namespace: "default", RunId: run.GetRunId()})
	require.NoError(t, err)
	events := hist.GetEvents()
	require.Equal(t, "a\uFFFDb", events[len(events)-1].GetDetail())

	// Ordinary calls still go through.
	id := invoke(t, s, "known", `{}`)
	require.Eventually(t, func() bool {
		_, err := s.tasks.GetTask(ctx, &flov1.GetTaskRequest{Namespace: "default", TaskId: id})
		return err == nil
	}, wait, 10*time.Millisecond, "the task invoked after the bad input was never stored")
}

// TestInvalidUTF8IsRefused: invalid UTF-8 in a string field never reaches a
// handler. The public port's codec refuses the message (grpc-go reports every
// decode failure as Internal, naming the cause: here the field) and
// grpc-gateway's JSON decoder refuses the body with 400.
func TestInvalidUTF8IsRefused(t *testing.T) {
	s := startStack(t)
	_, err := s.actions.RegisterAction(testContext(t), &flov1.RegisterActionRequest{Namespace: "default", Name: "known"})
	require.NoError(t, err)

	// An InvokeTaskRequest whose idempotency_key (field 5) holds 0xff, built
	// by hand since the Go protobuf runtime will not encode it.
	var raw []byte
	raw = protowire.AppendTag(raw, 1, protowire.BytesType)
	raw = protowire.AppendString(raw, "default")
	raw = protowire.AppendTag(raw, 2, protowire.BytesType)
	raw = protowire.AppendString(raw, "known")
	raw = protowire.AppendTag(raw, 5, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte{'k', 0xff})
	var out rawMessage
	err = s.conn.Invoke(testContext(t), flov1.TaskService_InvokeTask_FullMethodName, rawMessage(raw), &out, grpc.ForceCodecV2(rawCodec{}))
	require.Error(t, err)
	require.Contains(t, status.Convert(err).Message(), "flo.v1.InvokeTaskRequest.idempotency_key: string field contains invalid UTF-8")

	resp := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/known/invoke", []byte("{\"idempotencyKey\": \"k\xff\"}"))
	require.Equal(t, http.StatusBadRequest, resp.status, "%s", resp.raw)

	require.Empty(t, commandKeys(t, s.brokers))
}

// TestWorkerTextIsRefusedOrCleaned: a Hello whose worker_id holds a NUL, or
// that declares more than MaxHelloActions actions, is refused; a worker's
// multi-megabyte error with NULs and a nack reason with a NUL are stored
// cleaned and capped, and the platform keeps going.
func TestWorkerTextIsRefusedOrCleaned(t *testing.T) {
	s := startStack(t)
	ctx := testContext(t)
	refused := func(t *testing.T, hello *flov1.Hello) error {
		stream, err := s.workers.Stream(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: hello}}))
		_, err = stream.Recv()
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		return err
	}
	err := refused(t, &flov1.Hello{Token: adminToken, Namespace: "default", WorkerId: nul, Actions: []string{"known"}})
	require.Contains(t, status.Convert(err).Message(), "worker_id")
	many := make([]string, 1025)
	for i := range many {
		many[i] = fmt.Sprintf("a%d", i)
	}
	err = refused(t, &flov1.Hello{Token: adminToken, Namespace: "default", Actions: many})
	require.Contains(t, status.Convert(err).Message(), "at most 1024")
	err = refused(t, &flov1.Hello{Token: adminToken, Namespace: "default", Actions: []string{nul}})
	require.Contains(t, status.Convert(err).Message(), "actions[0]")

	// A Ready naming an action with a NUL ends its stream.
	bad := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w0", Namespace: "default", Actions: []string{"known"}})
	bad.ready(t, 1, 1000, nul)
	err = bad.ended(t)
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "Ready's action")

	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "w1", Namespace: "default", Actions: []string{"known"}})
	loud := invoke(t, s, "known", `{}`)
	nacked := invoke(t, s, "known", `{}`)
	w.ready(t, 2, 20_000)
	byID := map[string]*flov1.TaskAssignment{}
	for _, a := range w.tasks(t, 2) {
		byID[a.GetTaskId()] = a
	}
	huge := strings.Repeat("boom\x00\xff", 3<<20/6)
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_ResultBatch{ResultBatch: &flov1.ResultBatch{Results: []*flov1.Result{{
		TaskId: loud, Attempt: byID[loud].GetAttempt(),
		Outcome: &flov1.Result_Failed{Failed: &flov1.Failed{Error: strings.ToValidUTF8(huge, "?"), Retry: false}},
	}}}}})
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Nack{Nack: &flov1.Nack{TaskId: nacked, Attempt: byID[nacked].GetAttempt(), Reason: nul}}})

	failed := awaitStatus(t, s, loud, flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED)
	require.LessOrEqual(t, len(failed.GetError()), text.MaxFreeBytes)
	require.True(t, strings.HasPrefix(failed.GetError(), "boom\uFFFD?boom"), "%.40q", failed.GetError())
	require.Contains(t, failed.GetError(), "bytes]")

	// The nacked task comes back with its reason cleaned, and completes.
	w.ready(t, 1, 20_000)
	again := w.tasks(t, 1)[0]
	require.Equal(t, nacked, again.GetTaskId())
	task, err := s.tasks.GetTask(ctx, &flov1.GetTaskRequest{Namespace: "default", TaskId: nacked})
	require.NoError(t, err)
	require.Equal(t, "a\uFFFDb", task.GetError())
	w.send(t, &flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Result{Result: completed(nacked, again.GetAttempt(), `{"ok":true}`)}})
	awaitStatus(t, s, nacked, flov1.TaskStatus_TASK_STATUS_COMPLETED)
}

// TestStreamNackReasonWithNUL: a stream worker's nack reason holding a NUL
// is cleaned; the settle it shares with an ack goes through and the nacked
// record comes back.
func TestStreamNackReasonWithNUL(t *testing.T) {
	s := startStreamsStack(t, false)
	createStreamAndGroup(t, s, "events", "g")
	ids := appendN(t, s, "events", 2)
	w := openWorker(t, s, &flov1.Hello{Token: adminToken, WorkerId: "sw1", Namespace: "default",
		Streams: []*flov1.StreamSubscription{{Stream: "events", Group: "g"}}})
	w.streamRead(t, "events", "g", 2, 20_000)
	require.ElementsMatch(t, ids, recordIDs(w.recordBatch(t).GetRecords()))
	w.nack(t, "events", "g", nul+strings.Repeat("x", 1<<20), ids[0])
	w.ack(t, "events", "g", ids[1])
	w.sync(t)
	w.streamRead(t, "events", "g", 2, 20_000)
	require.Equal(t, []string{ids[0]}, recordIDs(w.recordBatch(t).GetRecords()))
	w.ack(t, "events", "g", ids[0])
	require.Eventually(t, func() bool { return pendingTotal(t, s, "events", "g") == 0 }, wait, 10*time.Millisecond)
}

// rawMessage is a request or response as encoded bytes, for rawCodec.
type rawMessage []byte

// rawCodec sends rawMessage bytes as they are, so a test can send what the
// protobuf runtime would refuse to encode.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawMessage))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*(v.(*rawMessage)) = data.Materialize()
	return nil
}
