package devstack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	flo "github.com/razorbill/flo-go"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/text"
	"github.com/razorbill/flo/proto/codec"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// threeStepsYAML is a workflow of three action steps in a row.
const threeStepsYAML = `kind: Workflow
name: three-steps
version: "1"
idempotency: none
start:
  run: "@actions/step-a"
  transitions:
    success: second
    failure: flo.Failed
steps:
  second:
    run: "@actions/step-b"
    transitions:
      success: third
      failure: flo.Failed
  third:
    run: "@actions/step-c"
    transitions:
      success: flo.Completed
      failure: flo.Failed
`

// postJSON posts body to the gateway's REST facade and returns the status
// and the decoded answer.
func postJSON(t *testing.T, e *env, path string, body any) (int, map[string]any) {
	t.Helper()
	data, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := restCall(http.MethodPost, "http://"+e.stack.GatewayHTTPAddr()+path, data)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// TestBadTextThenEverythingStillMoves sends text the store cannot hold from
// every side: NULs in keys and ids over REST and gRPC, a gRPC string that is
// not UTF-8, invoke commands produced straight to the log with a NUL key and
// with a key that is not UTF-8, a worker's Hello with a NUL id, a worker's
// multi-megabyte error full of NULs, a worker's error that is not UTF-8, task
// and stream nack reasons with NULs. Each is refused or stored cleaned, and
// then 1,000 tasks, 100 three-step workflow runs and 1,000 stream records
// all complete.
func TestBadTextThenEverythingStillMoves(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const nul = "a\x00b"
	c := e.client(t, "default")

	// Workers: the load's actions, and actions whose handlers send bad text.
	var nacks atomic.Int32
	e.worker(t, "default", flo.ActionWorkerOptions{Concurrency: 64}, func(w *flo.ActionWorker) {
		ok := func(*flo.ActionContext) ([]byte, error) { return []byte(`{"ok":true}`), nil }
		for _, name := range []string{"work", "step-a", "step-b", "step-c"} {
			w.MustRegisterAction(name, ok)
		}
		w.MustRegisterAction("loud", func(*flo.ActionContext) ([]byte, error) {
			return nil, flo.NewDeadLetterError(errors.New(strings.Repeat("boom\x00", 2<<20/5)))
		})
		w.MustRegisterAction("garbled", func(*flo.ActionContext) ([]byte, error) {
			return nil, flo.NewDeadLetterError(errors.New("bad \xff\xfe byte"))
		})
		w.MustRegisterAction("nacky", func(*flo.ActionContext) ([]byte, error) {
			if nacks.Add(1) == 1 {
				return nil, flo.NewNackErrorf(0, "not yet: %s", nul)
			}
			return []byte(`{"ok":true}`), nil
		})
	})
	waitActions(t, c, "work", "step-a", "step-b", "step-c", "loud", "garbled", "nacky")
	_, err := c.CreateStream(ctx, "events", flo.StreamOptions{Partitions: 4})
	require.NoError(t, err)

	// Over REST: the invoke with a NUL idempotency key, and others.
	for _, bad := range []struct{ path, field string }{
		{"/v1/namespaces/default/actions/work/invoke", "idempotency_key"},
		{"/v1/namespaces/default/workflows/three-steps/runs", "idempotency_key"},
	} {
		code, body := postJSON(t, e, bad.path, map[string]any{"idempotencyKey": nul})
		require.Equal(t, http.StatusBadRequest, code, "%s: %v", bad.path, body)
		require.Contains(t, body["message"], bad.field)
	}
	code, body := postJSON(t, e, "/v1/namespaces/default/workers", map[string]any{"workerId": nul, "workerType": "WORKER_TYPE_ACTION"})
	require.Equal(t, http.StatusBadRequest, code, "%v", body)

	// Over gRPC.
	conn := dial(t, e.stack.GatewayGRPCAddr())
	tasks := flov1.NewTaskServiceClient(conn)
	_, err = tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: "work", IdempotencyKey: nul})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	// The public port checks UTF-8 as it decodes (it keeps gRPC's default
	// codec), also from a client that sends bytes without checking them.
	_, err = tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: "work", IdempotencyKey: "k\xff"}, grpc.ForceCodecV2(codec.Fast))
	require.Error(t, err)
	require.Contains(t, status.Convert(err).Message(), "UTF-8")
	_, err = flov1.NewWorkflowServiceClient(conn).StartRun(ctx, &flov1.StartRunRequest{Namespace: "default", Workflow: "three-steps", IdempotencyKey: nul})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	_, err = flov1.NewStreamServiceClient(conn).GroupRead(ctx, &flov1.GroupReadRequest{Namespace: "default", Stream: "events", Group: "g", Consumer: nul})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	stream, err := flov1.NewWorkerServiceClient(conn).Stream(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&flov1.WorkerMessage{Msg: &flov1.WorkerMessage_Hello{Hello: &flov1.Hello{
		Namespace: "default", WorkerId: nul, Actions: []string{"work"},
	}}}))
	_, err = stream.Recv()
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "worker_id")

	// Straight onto the log, past the gateway: the dispatcher refuses the
	// command alone (it is dead-lettered) instead of failing its batch.
	poisonID := uuid.NewString()
	value, err := proto.Marshal(&eventsv1.InvokeTask{EventId: uuid.NewString(), TaskId: poisonID, Namespace: "default", Action: "work", IdempotencyKey: nul})
	require.NoError(t, err)
	producer, err := kgo.NewClient(kgo.SeedBrokers(e.broker.Addrs()...))
	require.NoError(t, err)
	defer producer.Close()
	require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Topic: kafka.CommandsTopic, Key: []byte(poisonID), Value: value}).FirstErr())
	// And one whose key is not UTF-8 (the generated encoder does not check).
	garbledID := uuid.NewString()
	value, err = (&eventsv1.InvokeTask{EventId: uuid.NewString(), TaskId: garbledID, Namespace: "default", Action: "work", IdempotencyKey: "k\xff"}).MarshalVT()
	require.NoError(t, err)
	require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Topic: kafka.CommandsTopic, Key: []byte(garbledID), Value: value}).FirstErr())

	// From workers: a 2 MiB error of NULs, a task nack reason with a NUL, and
	// a stream nack reason with a NUL (the first delivery of one record).
	loud, err := c.Invoke(ctx, "loud", map[string]any{})
	require.NoError(t, err)
	garbled, err := c.Invoke(ctx, "garbled", map[string]any{})
	require.NoError(t, err)
	nacky, err := c.Invoke(ctx, "nacky", map[string]any{})
	require.NoError(t, err)
	records := newHandled()
	var refusedOnce atomic.Bool
	e.streamWorker(t, flo.StreamWorkerOptions{Stream: "events", Group: "g", Concurrency: 64, BatchSize: 200},
		func(sctx *flo.StreamContext) error {
			var rec struct{ Bad bool }
			if err := sctx.Into(&rec); err != nil {
				return err
			}
			if rec.Bad && refusedOnce.CompareAndSwap(false, true) {
				return fmt.Errorf("refused %s%s", nul, strings.Repeat("x", 1<<20))
			}
			records.add(sctx.StreamID())
			return nil
		})
	badRecord, err := c.Append(ctx, "events", map[string]bool{"bad": true})
	require.NoError(t, err)

	// Everything behind the bad input moves.
	payloads := make([]any, 1000)
	for i := range payloads {
		payloads[i] = map[string]int{"i": i}
	}
	var ids []string
	for from := 0; from < len(payloads); from += 250 {
		got, err := c.InvokeMany(ctx, "work", payloads[from:from+250])
		require.NoError(t, err)
		ids = append(ids, got...)
	}
	createWorkflow(t, c, threeStepsYAML)
	runs := make([]string, 100)
	for i := range runs {
		run, err := c.StartWorkflow(ctx, "three-steps", map[string]int{"i": i}, flo.StartWorkflowOptions{})
		require.NoError(t, err)
		runs[i] = run.RunID
	}
	recordIDs := append(appendN(t, c, "events", 1000, 250), badRecord)

	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, e.db.QueryRow(ctx, `SELECT count(*) FROM dispatcher.tasks WHERE id::text = ANY($1) AND state = 'completed'`, ids).Scan(&done))
		return done == len(ids)
	}, 60*time.Second, 50*time.Millisecond, "states: %v", e.countByState(t, "default"))
	for _, id := range runs {
		awaitRun(t, c, id, flo.RunCompleted)
	}
	records.requireEachOnce(t, recordIDs, 60*time.Second)
	requireSettled(t, c, "events", "g")

	// The bad text was stored cleaned and capped; the log's bad command
	// made no task.
	task, err := c.GetTask(ctx, loud)
	require.NoError(t, err)
	require.Equal(t, flo.TaskDeadLettered, task.Status)
	require.LessOrEqual(t, len(task.Error), text.MaxFreeBytes)
	require.True(t, strings.HasPrefix(task.Error, "boom\uFFFDboom"), "%.40q", task.Error)
	// The SDK sent the error that was not UTF-8 marked, not refused.
	task, err = c.GetTask(ctx, garbled)
	require.NoError(t, err)
	require.Equal(t, flo.TaskDeadLettered, task.Status)
	require.Equal(t, "bad \uFFFD byte", task.Error)
	task, err = c.GetTask(ctx, nacky)
	require.NoError(t, err)
	require.Equal(t, flo.TaskCompleted, task.Status)
	for _, id := range []string{poisonID, garbledID} {
		_, err = tasks.GetTask(ctx, &flov1.GetTaskRequest{Namespace: "default", TaskId: id})
		require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	}
}
