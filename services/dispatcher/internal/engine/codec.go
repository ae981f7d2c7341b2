package engine

import (
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/razorbill/flo/libs/backoff"
	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/libs/text"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// CmdHeader is the header of every events record that holds the commands
// offset its partition's owner had consumed up to (the next one to read):
// the checkpoint a rebuild resumes the commands from.
const CmdHeader = "flo-cmd"

// ErrNoState is wrapped by Decode for a record that carries no task state
// (written before partitions had owners), which cannot be replayed.
var ErrNoState = errors.New("task event carries no task state")

// EncodeAll makes the events records of changes for partition, each stamped
// with the commands offset consumed so far, and the outcome records of
// those whose type is an outcome (taskevent.Type.Outcome). The event's own
// fields keep their meaning for every consumer (a result only on a
// COMPLETED event of a task with an origin, free text capped at
// taskevent.MaxTextBytes); TaskState carries the rest of the task, the
// payload only on the records that bring it to life. An outcome record is
// the same event (the same event id) without the TaskState and the stamp.
// A batch makes one record per change and outcome, so the records, their
// headers and their bytes are carved from a few shared allocations
// (encoder), not made one by one: the collector's cycles on a busy box are
// what hold tasks back at the tail (docs/benchmarks.md).
func EncodeAll(changes []Change, partition int32, cmdOffset int64) (events, outcomes []*kgo.Record, err error) {
	n := 0
	for i := range changes {
		if changes[i].Type.Outcome() {
			n++
		}
	}
	slab := make([]kgo.Record, len(changes)+n)
	events = make([]*kgo.Record, len(changes))
	outcomes = make([]*kgo.Record, 0, n)
	e := encoder{cmd: strconv.AppendInt(nil, cmdOffset, 10)}
	for i := range changes {
		e.left = len(changes) - i
		var out *kgo.Record
		if changes[i].Type.Outcome() {
			out = &slab[len(changes)+len(outcomes)]
			outcomes = append(outcomes, out)
		}
		if err := e.encode(&slab[i], out, &changes[i], partition); err != nil {
			return nil, nil, err
		}
		events[i] = &slab[i]
	}
	return events, outcomes, nil
}

// The most a chunk of an encoder is made for beyond one record's need.
const (
	chunkBytes   = 64 << 10
	chunkHeaders = 1 << 10
)

// encoder encodes one batch's records.
type encoder struct {
	// cmd is the stamp's value, shared by every record.
	cmd []byte
	// state is scratch for a TaskState: the event copies it.
	state []byte
	// bytes and headers are the free ends of the chunks the records'
	// bytes and headers are carved from; left is how many records are
	// still to encode, the current one included. A chunk holds what the
	// record that needs it takes, times left (up to a bound): a batch's
	// records are alike, so it makes about one of each.
	bytes   []byte
	headers []kgo.RecordHeader
	left    int
}

// carve returns n elements of the chunk free is the unused end of, making
// a new chunk when it has not room: of n times left, but at most most
// unless n is more, so one large record (a big payload) does not size the
// chunk of a thousand after it. The result's capacity is n, so nothing
// appended to it runs into its neighbour.
func carve[T any](free *[]T, n, left, most int) []T {
	if cap(*free)-len(*free) < n {
		*free = make([]T, 0, max(n, min(n*left, most)))
	}
	at := len(*free)
	*free = (*free)[:at+n]
	return (*free)[at : at+n : at+n]
}

// encode fills rec with the events record of c, and out, when not nil,
// with its outcome record.
func (e *encoder) encode(rec, out *kgo.Record, c *Change, partition int32) error {
	t := &c.Task
	st := &eventsv1.TaskState{
		IdempotencyKey:    t.IdempotencyKey,
		Priority:          t.Priority,
		MaxAttempts:       t.Settings.MaxAttempts,
		TimeoutMs:         t.Settings.Timeout.Milliseconds(),
		BackoffKind:       string(t.Settings.Backoff.Kind),
		BackoffInitialMs:  t.Settings.Backoff.Initial.Milliseconds(),
		BackoffMaxMs:      t.Settings.Backoff.Max.Milliseconds(),
		BackoffMultiplier: t.Settings.Backoff.Multiplier,
		TraceContext:      t.TraceContext,
		RunAt:             stamp(t.RunAt),
		LeaseUntil:        stamp(t.LeaseUntil),
		CompletionSecret:  t.CompletionSecret,
		CompleteBy:        stamp(t.CompleteBy),
		StartedAt:         stamp(t.StartedAt),
		FinishedAt:        stamp(t.FinishedAt),
	}
	if c.Type == taskevent.Created || c.Type == taskevent.Requeued {
		st.Payload = t.Payload
	}
	// The event id and the task id are not set here: putIDs writes them
	// ahead of the rest, with no string made for either.
	ev := &eventsv1.TaskEvent{
		Type:       c.Type.Proto(),
		Namespace:  t.Namespace,
		Action:     t.Action,
		Status:     taskevent.Status(t.Status),
		Attempt:    t.Attempt,
		WorkerId:   t.WorkerID,
		Outcome:    text.Clean(t.Outcome, taskevent.MaxTextBytes),
		Error:      text.Clean(t.Error, taskevent.MaxTextBytes),
		OccurredAt: timestamppb.New(t.UpdatedAt),
		CreatedAt:  timestamppb.New(t.CreatedAt),
		Origin:     t.Origin,
		// Only the workflow service reads results off the log; other
		// consumers read them from the dispatcher when they need them.
		NonRetryable: c.Type == taskevent.Failed,
		TimedOut:     t.TimedOut,
		ErrorCode:    t.ErrorCode,
	}
	if ev.Outcome != t.Outcome {
		st.Outcome = t.Outcome
	}
	if ev.Error != t.Error {
		st.Error = t.Error
	}
	if t.Origin != "" && c.Type == taskevent.Completed {
		ev.Result = t.Result
	} else {
		st.Result = t.Result
	}
	stateSize := st.SizeVT()
	e.state = slices.Grow(e.state[:0], stateSize)[:stateSize]
	if _, err := st.MarshalToSizedBufferVT(e.state); err != nil {
		return fmt.Errorf("encode %s state of task %s: %w", ev.Type, t.ID, err)
	}
	trace := c.TraceHeaders
	if trace == nil {
		trace = t.TraceContext
	}
	// The values of the record and the outcome and the trace headers'
	// values, in one carving.
	outSize := 0
	if out != nil {
		outSize = idsSize + ev.SizeVT()
	}
	ev.State = e.state
	size := idsSize + ev.SizeVT()
	need := size + outSize
	for _, v := range trace {
		need += len(v)
	}
	room := carve(&e.bytes, need, e.left, chunkBytes)
	value := room[:size:size]
	id := kafka.NewEventID()
	key := putIDs(value, id, t.ID)
	if _, err := ev.MarshalToSizedBufferVT(value[idsSize:]); err != nil {
		return fmt.Errorf("encode %s event of task %s: %w", ev.Type, t.ID, err)
	}
	room = room[size:]
	var outValue []byte
	if out != nil {
		outValue = room[:outSize:outSize]
		putIDs(outValue, id, t.ID)
		ev.State = nil
		if _, err := ev.MarshalToSizedBufferVT(outValue[idsSize:]); err != nil {
			return fmt.Errorf("encode %s outcome of task %s: %w", ev.Type, t.ID, err)
		}
		room = room[outSize:]
	}
	cut := func(s string) []byte {
		b := room[:len(s):len(s)]
		copy(b, s)
		room = room[len(s):]
		return b
	}
	headers := carve(&e.headers, len(trace)+1, e.left, chunkHeaders)[:0]
	for k, v := range trace {
		headers = append(headers, kgo.RecordHeader{Key: k, Value: cut(v)})
	}
	traced := headers[:len(headers):len(headers)]
	headers = append(headers, kgo.RecordHeader{Key: CmdHeader, Value: e.cmd})
	// A record's time is its event's (franz-go would read the clock for
	// each record: a per cent of a loaded process).
	*rec = kgo.Record{Topic: kafka.TaskEventsTopic, Partition: partition, Key: key, Value: value, Headers: headers, Timestamp: t.UpdatedAt}
	if out != nil {
		// The two records share the key and the trace headers: nothing
		// writes a record's bytes once it is made.
		*out = kgo.Record{Topic: kafka.TaskOutcomesTopic, Partition: partition, Key: key, Value: outValue, Headers: traced, Timestamp: t.UpdatedAt}
	}
	return nil
}

// The numbers of TaskEvent's event_id and task_id fields, and the bytes
// putIDs writes for the two: each a tag, a length and a UUID's 36 characters.
var (
	eventIDField = protowire.Number((&eventsv1.TaskEvent{}).ProtoReflect().Descriptor().Fields().ByName("event_id").Number())
	taskIDField  = protowire.Number((&eventsv1.TaskEvent{}).ProtoReflect().Descriptor().Fields().ByName("task_id").Number())
	idsSize      = protowire.SizeTag(eventIDField) + protowire.SizeBytes(uuidLen) + protowire.SizeTag(taskIDField) + protowire.SizeBytes(uuidLen)
)

// uuidLen is the length of a UUID's text form.
const uuidLen = 36

// putIDs writes the event_id and task_id fields of a TaskEvent at the start
// of dst, ahead of the other fields (a decoder takes fields in any order),
// and returns the task id's text there, which is the record's key. Made as
// strings and marshalled, the two were a fifth of what encoding an event
// allocated.
func putIDs(dst []byte, event, task uuid.UUID) (key []byte) {
	b := protowire.AppendTag(dst[:0], eventIDField, protowire.BytesType)
	b = protowire.AppendVarint(b, uuidLen)
	b = appendUUID(b, event)
	b = protowire.AppendTag(b, taskIDField, protowire.BytesType)
	b = protowire.AppendVarint(b, uuidLen)
	at := len(b)
	b = appendUUID(b, task)
	return b[at:len(b):len(b)]
}

// appendUUID appends u's text form (8-4-4-4-12 hex digits), as u.String()
// makes it.
func appendUUID(dst []byte, u uuid.UUID) []byte {
	for i, group := range [...][2]int{{0, 4}, {4, 6}, {6, 8}, {8, 10}, {10, 16}} {
		if i > 0 {
			dst = append(dst, '-')
		}
		dst = hex.AppendEncode(dst, u[group[0]:group[1]])
	}
	return dst
}

// Decode reads a record Encode made, and the commands offset it holds (-1
// when it has none). Payload is nil on records that do not carry it; Apply
// keeps the held one.
func Decode(r *kgo.Record) (Change, int64, error) {
	var ev eventsv1.TaskEvent
	if err := proto.Unmarshal(r.Value, &ev); err != nil {
		return Change{}, 0, fmt.Errorf("decode task event at %d/%d: %w", r.Partition, r.Offset, err)
	}
	cmd := int64(-1)
	var trace map[string]string
	for _, h := range r.Headers {
		if h.Key == CmdHeader {
			n, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return Change{}, 0, fmt.Errorf("decode task event at %d/%d: header %s: %w", r.Partition, r.Offset, CmdHeader, err)
			}
			cmd = n
			continue
		}
		if trace == nil {
			trace = make(map[string]string, len(r.Headers))
		}
		trace[h.Key] = string(h.Value)
	}
	typ, ok := taskevent.TypeOf(ev.GetType())
	if !ok {
		return Change{}, 0, fmt.Errorf("decode task event at %d/%d: unknown type %s", r.Partition, r.Offset, ev.GetType())
	}
	if len(ev.GetState()) == 0 {
		return Change{}, cmd, fmt.Errorf("decode task event at %d/%d: %w", r.Partition, r.Offset, ErrNoState)
	}
	st := &eventsv1.TaskState{}
	if err := proto.Unmarshal(ev.GetState(), st); err != nil {
		return Change{}, cmd, fmt.Errorf("decode task state at %d/%d: %w", r.Partition, r.Offset, err)
	}
	id, err := uuid.Parse(ev.GetTaskId())
	if err != nil {
		return Change{}, 0, fmt.Errorf("decode task event at %d/%d: task_id %q: %w", r.Partition, r.Offset, ev.GetTaskId(), err)
	}
	t := Task{
		ID: id, Namespace: ev.GetNamespace(), Action: ev.GetAction(), Status: statusOf(ev.GetStatus()),
		Priority: st.GetPriority(), Payload: st.GetPayload(), Result: ev.GetResult(),
		Outcome: ev.GetOutcome(), Error: ev.GetError(), ErrorCode: ev.GetErrorCode(), TimedOut: ev.GetTimedOut(),
		IdempotencyKey: st.GetIdempotencyKey(), Attempt: ev.GetAttempt(),
		Settings: store.Settings{
			MaxAttempts: st.GetMaxAttempts(),
			Timeout:     time.Duration(st.GetTimeoutMs()) * time.Millisecond,
			Backoff: backoff.Policy{
				Kind:       backoff.Kind(st.GetBackoffKind()),
				Initial:    time.Duration(st.GetBackoffInitialMs()) * time.Millisecond,
				Max:        time.Duration(st.GetBackoffMaxMs()) * time.Millisecond,
				Multiplier: st.GetBackoffMultiplier(),
			},
		},
		WorkerID: ev.GetWorkerId(), TraceContext: st.GetTraceContext(), Origin: ev.GetOrigin(),
		CreatedAt: unstamp(ev.GetCreatedAt()), RunAt: unstamp(st.GetRunAt()), StartedAt: unstamp(st.GetStartedAt()),
		FinishedAt: unstamp(st.GetFinishedAt()), UpdatedAt: unstamp(ev.GetOccurredAt()),
		LeaseUntil: unstamp(st.GetLeaseUntil()), CompletionSecret: st.GetCompletionSecret(), CompleteBy: unstamp(st.GetCompleteBy()),
	}
	if len(t.Result) == 0 {
		t.Result = st.GetResult()
	}
	if st.GetOutcome() != "" {
		t.Outcome = st.GetOutcome()
	}
	if st.GetError() != "" {
		t.Error = st.GetError()
	}
	c := Change{Type: typ, Task: t}
	if !maps.Equal(trace, t.TraceContext) {
		c.TraceHeaders = trace
	}
	return c, cmd, nil
}

// stamp is t on the wire, nil when unset.
func stamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// unstamp is a wire time, zero when unset.
func unstamp(ts *timestamppb.Timestamp) time.Time {
	if ts == nil {
		return time.Time{}
	}
	return ts.AsTime()
}

// statuses are every task state, for reading them back from API statuses.
var statuses = [...]store.Status{store.Queued, store.Running, store.Waiting, store.Completed, store.Failed, store.DeadLettered}

// statusOf is the task state of an API status; empty for none (a REJECTED
// event's).
func statusOf(s flov1.TaskStatus) store.Status {
	for _, st := range statuses {
		if taskevent.Status(st) == s {
			return st
		}
	}
	return ""
}
