package flo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	flo "github.com/razorbill/flo-go"
)

// A client is bound to one namespace; Connect prepares the connection, which is opened on
// first use.
func ExampleNewClient() {
	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	if err := client.Connect(); err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
	_, err := client.RegisterAction(ctx, "send-email", flo.ActionOptions{
		Timeout:     30 * time.Second,
		MaxAttempts: 5,
		Backoff: &flo.Backoff{
			Kind:       flo.BackoffExponential,
			Initial:    time.Second,
			Max:        time.Minute,
			Multiplier: 2,
		},
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A worker runs handlers until its context ends, then finishes the tasks it holds.
func ExampleClient_NewActionWorker() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	if err := client.Connect(); err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	w, err := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 10})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()

	w.MustRegisterAction("validate-order", func(actx *flo.ActionContext) (interface{}, error) {
		var order struct {
			OrderID string  `json:"orderId"`
			Amount  float64 `json:"amount"`
		}
		if err := actx.Into(&order); err != nil {
			return nil, flo.NewNonRetryableError(err)
		}
		if order.OrderID == "" {
			return nil, flo.NewNonRetryableErrorf("missing orderId")
		}
		if order.Amount >= 500 {
			return actx.Result("needs_review", map[string]any{"orderId": order.OrderID})
		}
		return map[string]any{"valid": true, "orderId": order.OrderID}, nil
	})

	if err := w.Start(ctx); err != nil {
		log.Fatal(err)
	}
}

// A stream worker joins its consumer group (creating it if needed), handles each record in
// its own goroutine, and acks the record when the handler returns nil or nacks it for
// redelivery when the handler returns an error or panics. This is the reference's example as
// written there.
func ExampleClient_NewStreamWorker() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	client.Connect()
	defer client.Close()

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

	sw.Start(ctx) // blocks until context cancelled or drain
}

// Append returns the new record's id; Read returns records by id range, or the last ones.
func ExampleClient_Append() {
	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	if err := client.Connect(); err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
	if _, err := client.CreateStream(ctx, "events", flo.StreamOptions{Partitions: 4, Retention: 7 * 24 * time.Hour}); err != nil {
		log.Fatal(err)
	}
	id, err := client.Append(ctx, "events", map[string]string{"type": "signup"}, flo.WithKey("user-1"))
	if err != nil {
		log.Fatal(err)
	}
	records, _, err := client.Read(ctx, "events", flo.ReadOptions{Start: id, Count: 10})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range records {
		fmt.Println(r.ID, string(r.Payload))
	}
}

// Invoke returns the new task's id at once; AwaitTask waits for the task to finish.
func ExampleClient_Invoke() {
	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	if err := client.Connect(); err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
	id, err := client.Invoke(ctx, "process-order", map[string]any{"order_id": "o-1", "amount": 42},
		flo.WithIdempotencyKey("order-o-1"))
	if err != nil {
		log.Fatal(err)
	}
	task, err := client.AwaitTask(ctx, id, 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(task.Status, string(task.Result))
}

// Tasks print as JSON with their payload and result inline when those hold JSON.
func ExampleTask_MarshalJSON() {
	task := flo.Task{
		ID:          "0b6f3f9e-5f1c-4c1e-9d55-3f6f2f0e8a11",
		Namespace:   "myapp",
		Action:      "process-order",
		Status:      flo.TaskCompleted,
		Attempt:     1,
		MaxAttempts: 3,
		Payload:     []byte(`{"order_id":"o-1"}`),
		Result:      []byte(`{"status":"done"}`),
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(task); err != nil {
		log.Fatal(err)
	}
	// Output:
	// {
	//   "id": "0b6f3f9e-5f1c-4c1e-9d55-3f6f2f0e8a11",
	//   "namespace": "myapp",
	//   "action": "process-order",
	//   "status": "completed",
	//   "attempt": 1,
	//   "max_attempts": 3,
	//   "priority": 0,
	//   "payload": {
	//     "order_id": "o-1"
	//   },
	//   "result": {
	//     "status": "done"
	//   }
	// }
}

// A handler fails with a code that the task, its events and a workflow run's history show;
// wrapped in NewNonRetryableError the task fails at once.
func ExampleNewErrorWithCode() {
	charge := func(actx *flo.ActionContext) ([]byte, error) {
		return nil, flo.NewNonRetryableError(flo.NewErrorWithCode("card_declined", "card %s declined", "4242"))
	}
	_, err := charge(nil)
	fmt.Println(flo.ErrorCode(fmt.Errorf("charge: %w", err)), err)
	// Output: card_declined card 4242 declined
}
