// Package flo is the Go SDK for Flo, a durable-execution platform.
//
// A [Client] talks to the Flo gateway: it manages namespaces and actions, invokes actions and
// reads the tasks they create. An [ActionWorker] built from a client runs handlers for actions:
// it keeps one bidirectional stream to the gateway, asks for as many tasks as it has free
// handler slots, runs each task in its own goroutine and reports how each attempt ended.
//
//	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
//	if err := client.Connect(); err != nil { ... }
//	defer client.Close()
//
//	w, _ := client.NewActionWorker(flo.ActionWorkerOptions{Concurrency: 10})
//	w.MustRegisterAction("process-order", func(actx *flo.ActionContext) ([]byte, error) {
//		var order map[string]any
//		if err := actx.Into(&order); err != nil {
//			return nil, flo.NewNonRetryableError(err)
//		}
//		return actx.Bytes(map[string]string{"status": "done"})
//	})
//	w.Start(ctx) // blocks until ctx ends, then finishes the tasks it holds
//
// How a handler ends decides what happens to the task: a returned error is retried following
// the action's backoff policy, a panic is recovered and retried, [NewNonRetryableErrorf] fails
// the task at once, [NewDeadLetterErrorf] sends it to the dead-letter queue, [ErrAbandon] hands it
// back without counting the attempt and [NewNackErrorf] retries it after a chosen delay.
//
// A worker registers itself in the worker registry when it starts (its id, concurrency, actions,
// [ActionWorkerOptions.Metadata] and machine), sends a heartbeat with its load every
// [ActionWorkerOptions.HeartbeatInterval], and deregisters when Start returns. Draining it
// ([Client.DrainWorker], `flo worker drain`) makes it finish the tasks it holds, take no new
// ones, deregister and return from Start.
//
// Each handler execution runs in an OpenTelemetry span that continues the trace of the
// invocation, using the global tracer provider and propagator.
package flo
