// Package flo is the Go SDK for Flo, a durable-execution platform.
//
// A [Client] talks to the Flo gateway: it manages namespaces, actions and streams, invokes
// actions, reads the tasks they create, and appends to and reads streams. An [ActionWorker]
// built from a client runs handlers for actions: it keeps one bidirectional stream to the
// gateway, asks for as many tasks as it has free handler slots, runs each task in its own
// goroutine and reports how each attempt ended.
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
// [NewErrorWithCode] gives a failure a code ("card_declined") that the task, its events and a
// workflow run's history show; it is retried like any error unless wrapped in
// [NewNonRetryableError] (or wrapping a non-retryable error with %w), and [ErrorCode] finds the
// code anywhere in an error's chain:
//
//	return nil, flo.NewNonRetryableError(flo.NewErrorWithCode("card_declined", "card %s declined", last4))
//
// A handler whose result arrives later (a webhook, another service) returns [ErrResultPending]
// (or [ResultPendingWithin] for its own deadline) after handing [ActionContext.CompletionToken] to
// whoever will deliver it; the worker's slot is free at once and the task waits, as Temporal's
// asynchronous activity completion does. That party calls [Client.CompleteTask] or
// [Client.FailTask] (final: no further attempt) with the token; no result within 24 hours (at
// most 7 days) fails the task as timed out, so a workflow step takes its timeout transition:
//
//	w.MustRegisterAction("ship", func(actx *flo.ActionContext) ([]byte, error) {
//		if err := carrier.Book(actx, order, actx.CompletionToken()); err != nil {
//			return nil, err
//		}
//		return nil, flo.ErrResultPending
//	})
//	// later, in the carrier's webhook handler:
//	_, err := client.CompleteTask(ctx, token, body, "")
//
// A worker registers itself in the worker registry when it starts (its id, concurrency, actions,
// [ActionWorkerOptions.Metadata] and machine), sends a heartbeat with its load every
// [ActionWorkerOptions.HeartbeatInterval], and deregisters when Start returns. A registry that
// is down, slow or overloaded does not stop it: the worker starts working and keeps registering
// with backoff until the registry takes it; only a refusal (the namespace's worker limit, bad
// metadata) makes Start return an error. Draining it
// ([Client.DrainWorker], `flo worker drain`) makes it finish the tasks it holds, take no new
// ones, deregister and return from Start.
//
// Streams are append-only logs of records: [Client.Append], [Client.AppendMany] and
// [Client.AppendRecords] add records, [Client.Read] reads them by id range or from the tail,
// and consumer groups ([Client.CreateGroup]) hand each record to one consumer of the group. A
// [StreamWorker] is such a consumer: it reads batches over the same worker stream, runs the
// handler for each record and acks it when the handler returns nil, or nacks it (the group
// hands it out again) when the handler returns an error, panics or outlives
// [StreamWorkerOptions.MessageTimeout]:
//
//	sw, _ := client.NewStreamWorker(flo.StreamWorkerOptions{Stream: "events", Group: "processors"},
//		func(sctx *flo.StreamContext) error {
//			var event map[string]any
//			if err := sctx.Into(&event); err != nil {
//				return err
//			}
//			return process(sctx.Context(), event)
//		})
//	sw.Start(ctx)
//
// Stream workers register, heartbeat, drain and deregister exactly as action workers do.
//
// Workflows are YAML definitions whose steps run actions, child workflows or wait for signals.
// [Client.CreateWorkflow] stores a new version (a definition with errors comes back as a
// [*ValidationError] listing every [Diagnostic] with its line and column),
// [Client.StartWorkflow] starts a run, idempotently with a key, [Client.SignalRun] delivers a
// signal, [Client.CancelRun] ends a run, and [Client.GetRun], [Client.ListRuns] and
// [Client.GetRunHistory] show where runs are and how they got there. [Client.GetWorkflowPlans]
// shows a workflow's plans with each executor's health and breaker on the replica that answers,
// and [Client.InvalidatePlanCache] removes the cached plan outcomes an event invalidates. The
// steps' actions run on ordinary action workers:
//
//	run, _ := client.StartWorkflow(ctx, "process-order", order, flo.StartWorkflowOptions{IdempotencyKey: order.ID})
//	final, err := client.AwaitRun(ctx, run.RunID) // until completed, failed, cancelled or timed out
//
// Every call carries an API key, `flo_<id>_<secret>`, as a bearer token: [WithToken], or the
// FLO_TOKEN environment variable when no option gives one. A key has a role in one namespace
// (client, worker or read), or is an admin key for all of them; an admin makes keys with
// [Client.CreateKey] and withdraws them with [Client.RevokeKey]. [WithCAFile] (or FLO_CA_FILE)
// speaks TLS to the gateway, verifying it against a CA certificate, and [WithTLS] takes a whole
// tls.Config.
//
// Each handler execution runs in an OpenTelemetry span that continues the trace of the
// invocation or of the record's append, using the global tracer provider and propagator.
package flo
