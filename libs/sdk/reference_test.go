package flo_test

import (
	"context"
	"fmt"
	"testing"

	flo "github.com/razorbill/flo-go"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/stretchr/testify/require"
)

// The handlers below are the Go examples of the worker documentation, as written there; the
// test holds the SDK to them.

const totalSteps = 3

var result = map[string]string{"report": "ready"}

func processStep(int) {}

func registerReferenceHandlers(w *flo.ActionWorker) {
	w.MustRegisterAction("generate-report", func(actx *flo.ActionContext) ([]byte, error) {
		// For long tasks, extend the lease periodically
		for i := 0; i < totalSteps; i++ {
			processStep(i)
			if (i+1)%3 == 0 {
				actx.Touch(30000) // extend by 30s
			}
		}
		return actx.Bytes(result)
	})

	w.MustRegisterAction("validate-order", func(actx *flo.ActionContext) (interface{}, error) {
		var data struct {
			OrderID string  `json:"orderId"`
			Amount  float64 `json:"amount"`
		}
		actx.Into(&data)

		if data.OrderID == "" {
			return nil, flo.NewNonRetryableErrorf("missing orderId")
		}
		if data.Amount > 2000 {
			return nil, flo.NewNonRetryableErrorf("order amount $%.0f exceeds $2000 limit", data.Amount)
		}
		return map[string]interface{}{"valid": true, "orderId": data.OrderID}, nil
	})

	w.MustRegisterAction("review-order", func(actx *flo.ActionContext) (interface{}, error) {
		var data struct {
			OrderID string  `json:"orderId"`
			Amount  float64 `json:"amount"`
		}
		actx.Into(&data)

		if data.Amount < 100 {
			return actx.Result("approved", map[string]interface{}{
				"orderId":  data.OrderID,
				"decision": "auto-approved",
			})
		} else if data.Amount >= 500 {
			return actx.Result("rejected", map[string]interface{}{
				"orderId": data.OrderID,
				"reason":  "amount too high",
			})
		}
		return actx.Result("needs_review", map[string]interface{}{
			"orderId": data.OrderID,
			"note":    "manual review required",
		})
	})
}

func TestReferenceHandlers(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 10, Logger: quietLogger()})
	require.NoError(t, err)
	registerReferenceHandlers(w)
	runWorker(t, w)

	ps := p.accept(t)
	ps.handshake()
	require.Equal(t, int32(10), ps.nextReady().GetCount())
	ps.sendTasks(
		task("report", "generate-report", ""),
		task("valid", "validate-order", `{"orderId":"o-1","amount":10}`),
		task("missing", "validate-order", `{"amount":10}`),
		task("too-much", "validate-order", `{"orderId":"o-2","amount":2500}`),
		task("cheap", "review-order", `{"orderId":"o-3","amount":50}`),
		task("middle", "review-order", `{"orderId":"o-4","amount":200}`),
		task("dear", "review-order", `{"orderId":"o-5","amount":900}`),
	)

	results := map[string]*flov1.Result{}
	for len(results) < 7 {
		msg := ps.next()
		switch m := msg.GetMsg().(type) {
		case *flov1.WorkerMessage_Touch:
			require.Equal(t, "report", m.Touch.GetTaskId())
			require.Equal(t, int64(30000), m.Touch.GetExtendMs())
			ps.send(&flov1.ServerMessage{Msg: &flov1.ServerMessage_TouchAck{TouchAck: &flov1.TouchAck{TaskId: "report", Ok: true}}})
		case *flov1.WorkerMessage_ResultBatch:
			for _, r := range m.ResultBatch.GetResults() {
				results[r.GetTaskId()] = r
			}
		case *flov1.WorkerMessage_Ready:
		default:
			t.Fatalf("unexpected %v", msg)
		}
	}
	require.JSONEq(t, `{"report":"ready"}`, string(results["report"].GetCompleted().GetBody()))
	require.JSONEq(t, `{"valid":true,"orderId":"o-1"}`, string(results["valid"].GetCompleted().GetBody()))
	requireFailed(t, results["missing"], "missing orderId", false, true)
	requireFailed(t, results["too-much"], "order amount $2500 exceeds $2000 limit", false, true)
	for id, outcome := range map[string]string{"cheap": "approved", "middle": "needs_review", "dear": "rejected"} {
		require.Equal(t, outcome, results[id].GetCompleted().GetOutcome(), id)
	}
	require.JSONEq(t, `{"orderId":"o-5","reason":"amount too high"}`, string(results["dear"].GetCompleted().GetBody()))
}

// TestReferenceStreamWorker runs the stream worker of the worker documentation's quick start,
// as written there, against the scripted gateway.
func TestReferenceStreamWorker(t *testing.T) {
	t.Parallel()
	p, client := startPeer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)

	sw, _ := client.NewStreamWorker(flo.StreamWorkerOptions{
		Stream:      "events",
		Group:       "processors",
		Concurrency: 5,
		BatchSize:   10,
	}, func(sctx *flo.StreamContext) error {
		var event map[string]interface{}
		sctx.Into(&event)
		fmt.Printf("Processing event: %v\n", event)
		return nil // auto-ack
	})
	defer sw.Close()

	go func() { done <- sw.Start(ctx) }() // blocks until context cancelled or drain

	ps := p.accept(t)
	ps.handshake()
	read := ps.nextRead()
	require.Equal(t, int32(5), read.GetCount())
	require.Equal(t, "processors", read.GetGroup())
	ps.sendRecords(record("1767323045000-0", `{"type":"signup"}`), record("1767323045000-1000", `{"type":"login"}`))
	require.ElementsMatch(t, []string{"1767323045000-0", "1767323045000-1000"}, ps.settled(2).acks)
	cancel()
	require.NoError(t, requireReturns(t, done))
}
