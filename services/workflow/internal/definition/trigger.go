package definition

// Limits on triggers.
const MaxTriggerBatch = 1000

// TriggerMode is how a trigger's consumer group hands records to readers.
type TriggerMode string

// The consumer group modes.
const (
	TriggerShared    TriggerMode = "shared"
	TriggerExclusive TriggerMode = "exclusive"
	TriggerKeyShared TriggerMode = "key_shared"
)

// Trigger starts a run for each record (or batch of records) appended to a
// Flo stream.
type Trigger struct {
	Stream string
	// Namespace is the stream's namespace; empty means the workflow's.
	Namespace string
	// ConsumerGroup is the group the workflow service reads with; the
	// parser fills in wf-NAME when the definition names none.
	ConsumerGroup string
	Mode          TriggerMode
	// BatchSize is the records per run; above 1 the run's input is an array.
	BatchSize int
	Pos       Position
}

// StreamNamespace is the trigger's stream namespace: its own, or
// workflowNamespace when it names none.
func (t *Trigger) StreamNamespace(workflowNamespace string) string {
	if t.Namespace != "" {
		return t.Namespace
	}
	return workflowNamespace
}
