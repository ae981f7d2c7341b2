package kafka

// The platform's topics: the one table of their names. Each service names
// the topics it writes and reads through these, so a rename is one change
// here. Every record of the first three is keyed by its task id, and the
// three have the same partition count (FLO_KAFKA_PARTITIONS), so a task's
// commands, events and outcomes fall in partitions of the same number
// (docs/design/dispatch.md).
const (
	// CommandsTopic carries InvokeTask commands: written by the gateway
	// and the workflow runner, applied by the dispatcher replica that owns
	// the partition.
	CommandsTopic = "flo.actions.commands"
	// TaskEventsTopic carries every change of a task's state, with the
	// whole task, written by the partition's owner in transactions: the
	// partition's changelog, which a new owner replays.
	TaskEventsTopic = "flo.tasks.events"
	// TaskOutcomesTopic carries a copy, without the task's state, of the
	// events that end an attempt or a task (taskevent.Type.Outcome), in
	// the same transactions: read by the gateway (task waits), the
	// workflow runner and the registry's counters, which need nothing
	// else.
	TaskOutcomesTopic = "flo.tasks.outcomes"
	// WorkerEventsTopic carries the registry's worker events, keyed by
	// namespace/worker; every gateway replica tails it to learn that a
	// worker it serves is draining.
	WorkerEventsTopic = "flo.workers.events"
	// RunEventsTopic carries a RunEvent for every workflow run status
	// change, keyed by run id.
	RunEventsTopic = "flo.workflows.events"
	// StreamTopicPrefix starts the name of every stream's log topic; the
	// streams service adds the stream's id.
	StreamTopicPrefix = "flo.stream."
	// DeadLetterSuffix makes a topic's dead-letter topic: orders -> orders.dlq.
	DeadLetterSuffix = ".dlq"
)
