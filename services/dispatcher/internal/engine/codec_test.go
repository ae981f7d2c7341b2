package engine_test

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// roundTrip encodes c, decodes it, and checks what came back, and the
// outcome record when c's type has one.
func roundTrip(t *testing.T, c engine.Change, partition int32, cmd int64) (*kgo.Record, engine.Change) {
	t.Helper()
	recs, outcomes, err := engine.EncodeAll([]engine.Change{c}, partition, cmd)
	require.NoError(t, err)
	rec := recs[0]
	checkOutcome(t, c, rec, outcomes)
	require.Equal(t, kafka.TaskEventsTopic, rec.Topic)
	require.Equal(t, partition, rec.Partition)
	require.Equal(t, c.Task.ID.String(), string(rec.Key))
	got, gotCmd, err := engine.Decode(rec)
	require.NoError(t, err)
	require.Equal(t, cmd, gotCmd)
	require.Equal(t, c.Type, got.Type)
	want := c.Task
	if c.Type != taskevent.Created && c.Type != taskevent.Requeued {
		want.Payload = nil
	}
	require.Equal(t, normal(want), normal(got.Task))
	return rec, got
}

func event(t *testing.T, rec *kgo.Record) *eventsv1.TaskEvent {
	t.Helper()
	var ev eventsv1.TaskEvent
	require.NoError(t, proto.Unmarshal(rec.Value, &ev))
	return &ev
}

// stateOf reads the task state a record's event carries.
func stateOf(t *testing.T, ev *eventsv1.TaskEvent) *eventsv1.TaskState {
	t.Helper()
	var st eventsv1.TaskState
	require.NoError(t, proto.Unmarshal(ev.GetState(), &st))
	return &st
}

// checkOutcome checks that outcomes holds the outcome record of c, whose
// events record is rec, when c's type is an outcome, and nothing otherwise:
// rec's event, with the same id, without the task's state, and rec's
// headers but the commands stamp.
func checkOutcome(t *testing.T, c engine.Change, rec *kgo.Record, outcomes []*kgo.Record) {
	t.Helper()
	if !c.Type.Outcome() {
		require.Empty(t, outcomes, "a %v event has no outcome record", c.Type.Proto())
		return
	}
	require.Len(t, outcomes, 1)
	out := outcomes[0]
	require.Equal(t, kafka.TaskOutcomesTopic, out.Topic)
	require.Equal(t, rec.Partition, out.Partition)
	require.Equal(t, c.Task.ID.String(), string(out.Key))
	want := event(t, rec)
	require.NotEmpty(t, want.GetState())
	want.State = nil
	got := event(t, out)
	require.True(t, proto.Equal(want, got), "the outcome is the event without its state:\n%v\n%v", want, got)
	wantHeaders := headers(rec)
	delete(wantHeaders, engine.CmdHeader)
	require.Equal(t, wantHeaders, headers(out))
}

func headers(rec *kgo.Record) map[string]string {
	out := map[string]string{}
	for _, h := range rec.Headers {
		out[h.Key] = string(h.Value)
	}
	return out
}

func TestCodec(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	inv := invocation("send", 2)
	inv.Origin = "workflow"
	created := p.Invoke(nil, inv, settings(3), "", t0)
	claimed, started := p.Claim(ns, []string{"send"}, []engine.Slot{{WorkerID: "w1"}}, at(time.Second))
	require.Len(t, claimed, 1)
	_, failed := p.Report(nil, ns, engine.Report{TaskID: inv.TaskID.String(), Attempt: 1, Kind: engine.Fail, Error: "boom", Retry: true, ErrorCode: "E1"}, at(2*time.Second))
	claimed, _ = p.Claim(ns, []string{"send"}, []engine.Slot{{WorkerID: "w2"}}, at(time.Minute))
	require.Len(t, claimed, 1)
	_, extended, err := p.Touch(ns, inv.TaskID, 2, time.Minute, at(time.Minute))
	require.NoError(t, err)
	_, waiting := p.Report(nil, ns, engine.Report{TaskID: inv.TaskID.String(), Attempt: 2, Kind: engine.Pending}, at(time.Minute))
	_, completed, err := p.Finish(ns, engine.Token{ID: inv.TaskID, Attempt: 2, Secret: claimed[0].Task.CompletionSecret},
		engine.Finish{Result: []byte(`{"ok":true}`), Outcome: "sent"}, at(2*time.Minute))
	require.NoError(t, err)
	rejected := p.Invoke(nil, invocation("gone", 0), nil, "", t0)

	for _, tt := range []struct {
		name string
		c    engine.Change
	}{
		{"created", created[0]}, {"started", started[0]}, {"retry scheduled", failed[0]}, {"lease extended", extended[0]},
		{"waiting", waiting[0]}, {"completed", completed[0]}, {"rejected", rejected[0]},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec, got := roundTrip(t, tt.c, 7, 1234)
			ev := event(t, rec)
			require.Equal(t, tt.c.Type.Proto(), ev.GetType())
			require.Equal(t, tt.c.Task.Attempt, ev.GetAttempt())
			require.Equal(t, tt.c.Task.WorkerID, ev.GetWorkerId())
			require.Equal(t, tt.c.Task.ErrorCode, ev.GetErrorCode())
			require.Equal(t, tt.c.Type == taskevent.Failed, ev.GetNonRetryable())
			require.Equal(t, "1234", headers(rec)[engine.CmdHeader])
			require.Equal(t, inv.TraceContext["traceparent"], headers(rec)["traceparent"])
			require.Nil(t, got.TraceHeaders, "the task's own trace")
			require.LessOrEqual(t, len(ev.GetError()), taskevent.MaxTextBytes)
			if tt.c.Type == taskevent.Created {
				require.Equal(t, inv.Payload, stateOf(t, ev).GetPayload())
			} else {
				require.Empty(t, stateOf(t, ev).GetPayload())
			}
			if tt.c.Type == taskevent.Completed {
				require.Equal(t, []byte(`{"ok":true}`), ev.GetResult(), "a task with an origin has its result on the event")
			}
		})
	}

	// Text longer than an event carries is whole in the state only.
	long := failed[0]
	long.Task.Error = strings.Repeat("é", taskevent.MaxTextBytes)
	rec, _ := roundTrip(t, long, 0, 1)
	ev := event(t, rec)
	require.LessOrEqual(t, len(ev.GetError()), taskevent.MaxTextBytes)
	require.True(t, stateOf(t, ev).GetError() == long.Task.Error, "whole in the state")
	rec, _ = roundTrip(t, failed[0], 0, 1)
	require.Empty(t, stateOf(t, event(t, rec)).GetError(), "short text only once")

	// A report's span is what the record carries; the task keeps its own.
	c := completed[0]
	c.TraceHeaders = map[string]string{"traceparent": "00-report"}
	rec, got := roundTrip(t, c, 0, 2)
	require.Equal(t, c.TraceHeaders, got.TraceHeaders)
	require.Equal(t, "00-report", headers(rec)["traceparent"])

	// Without an origin the result is in the state only; a failure by
	// token is non-retryable.
	q := engine.New(0)
	task := running(t, q, 3, t0)
	_, done := q.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Complete, Result: []byte("r")}, t0)
	rec, _ = roundTrip(t, done[0], 0, 3)
	require.Empty(t, event(t, rec).GetResult())
	require.Equal(t, []byte("r"), stateOf(t, event(t, rec)).GetResult())
	task = running(t, q, 3, t0)
	_, fails, err := q.Finish(ns, engine.Token{ID: task.ID, Attempt: 1, Secret: task.CompletionSecret}, engine.Finish{Failed: true, Error: "no"}, t0)
	require.NoError(t, err)
	rec, _ = roundTrip(t, fails[0], 0, 4)
	require.True(t, event(t, rec).GetNonRetryable())
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	c := p.Invoke(nil, invocation("send", 0), settings(3), "", t0)[0]
	recs, _, err := engine.EncodeAll([]engine.Change{c}, 0, 9)
	require.NoError(t, err)
	rec := recs[0]

	ev := event(t, rec)
	ev.State = nil
	old := *rec
	old.Value, err = proto.Marshal(ev)
	require.NoError(t, err)
	old.Headers = nil
	_, cmd, err := engine.Decode(&old)
	require.ErrorIs(t, err, engine.ErrNoState, "a record of before partition owners")
	require.Equal(t, int64(-1), cmd)

	bad := *rec
	bad.Headers = []kgo.RecordHeader{{Key: engine.CmdHeader, Value: []byte("x")}}
	_, _, err = engine.Decode(&bad)
	require.Error(t, err)

	garbage := *rec
	garbage.Value = []byte{0xff, 0xff}
	_, _, err = engine.Decode(&garbage)
	require.Error(t, err)
	require.Equal(t, strconv.Itoa(9), headers(rec)[engine.CmdHeader])
}

// A batch's records are each their own change's, in order, and all carry
// the batch's commands offset.
func TestEncodeAllKeepsEachChangeItsOwnRecord(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	var changes []engine.Change
	for _, action := range []string{"a", "b", "c"} {
		inv := invocation(action, 0)
		inv.TraceContext = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0" + action}
		changes = append(changes, p.Invoke(nil, inv, settings(3), "", t0)...)
	}
	recs, _, err := engine.EncodeAll(changes, 2, 41)
	require.NoError(t, err)
	require.Len(t, recs, len(changes))
	for i, rec := range recs {
		got, cmd, err := engine.Decode(rec)
		require.NoError(t, err)
		require.Equal(t, int64(41), cmd)
		require.Equal(t, int32(2), rec.Partition)
		require.Equal(t, changes[i].Task.ID, got.Task.ID)
		require.Equal(t, changes[i].Task.Action, got.Task.Action)
	}
	// The records' bytes are carved from shared chunks: writing all of one
	// record's (but the stamp's, which they share by design) leaves its
	// neighbours' intact.
	for _, b := range append([][]byte{recs[0].Key, recs[0].Value}, traceValues(recs[0])...) {
		for i := range b {
			b[i] ^= 0xff
		}
	}
	require.Equal(t, changes[1].Task.ID.String(), string(recs[1].Key), "records share no key bytes")
	got, _, err := engine.Decode(recs[1])
	require.NoError(t, err, "records share no value or header bytes")
	require.Equal(t, changes[1].Task.ID, got.Task.ID)
	require.Equal(t, changes[1].Task.TraceContext, got.Task.TraceContext)
}

// Every event of a batch has an id of its own, a version 4 UUID, and names
// its task as a consumer that decodes it with the reflection-based decoder
// reads it; the record's key is the same task id.
func TestEncodeAllGivesEachEventItsOwnID(t *testing.T) {
	t.Parallel()
	_, changes := invokeN(50, "a")
	recs, _, err := engine.EncodeAll(changes, 0, 1)
	require.NoError(t, err)
	seen := map[string]bool{}
	for i, rec := range recs {
		var ev eventsv1.TaskEvent
		require.NoError(t, proto.Unmarshal(rec.Value, &ev))
		require.Equal(t, changes[i].Task.ID.String(), ev.GetTaskId())
		require.Equal(t, ev.GetTaskId(), string(rec.Key))
		require.Equal(t, "a", ev.GetAction())
		id, err := uuid.Parse(ev.GetEventId())
		require.NoError(t, err)
		require.Equal(t, id.String(), ev.GetEventId(), "the id is in the canonical text form")
		require.Equal(t, uuid.Version(4), id.Version())
		require.Equal(t, uuid.RFC4122, id.Variant())
		require.False(t, seen[ev.GetEventId()], "event id %s given twice", ev.GetEventId())
		seen[ev.GetEventId()] = true
	}
}

// In a batch of mixed changes, each outcome record follows its event's
// change, in the batch's order, and no other change makes one.
func TestEncodeAllMakesTheOutcomesOfABatch(t *testing.T) {
	t.Parallel()
	p, changes := invokeN(3, "send")
	claimed, started := p.Claim(ns, []string{"send"}, make([]engine.Slot, 3), t0)
	require.Len(t, claimed, 3)
	changes = append(changes, started...)
	_, changes = p.Report(changes, ns, engine.Report{TaskID: claimed[0].Task.ID.String(), Attempt: 1, Kind: engine.Complete}, t0)
	_, changes = p.Report(changes, ns, engine.Report{TaskID: claimed[2].Task.ID.String(), Attempt: 1, Kind: engine.Fail, Retry: true}, t0)
	require.Equal(t, []taskevent.Type{taskevent.Created, taskevent.Created, taskevent.Created, taskevent.Started, taskevent.Started,
		taskevent.Started, taskevent.Completed, taskevent.RetryScheduled}, types(changes))

	events, outcomes, err := engine.EncodeAll(changes, 3, 9)
	require.NoError(t, err)
	require.Len(t, events, len(changes))
	require.Len(t, outcomes, 2)
	for i, out := range outcomes {
		ev := events[6+i]
		require.Equal(t, event(t, ev).GetEventId(), event(t, out).GetEventId())
		require.Equal(t, changes[6+i].Type.Proto(), event(t, out).GetType())
		require.Equal(t, string(ev.Key), string(out.Key))
	}
}

// invokeN invokes n tasks of action on a new partition and returns it
// with their changes.
func invokeN(n int, action string) (*engine.Partition, []engine.Change) {
	p := engine.New(0)
	var changes []engine.Change
	for range n {
		changes = p.Invoke(changes, invocation(action, 0), settings(3), "", t0)
	}
	return p, changes
}

// traceValues are the values of rec's headers but the stamp.
func traceValues(rec *kgo.Record) [][]byte {
	var out [][]byte
	for _, h := range rec.Headers {
		if h.Key != engine.CmdHeader {
			out = append(out, h.Value)
		}
	}
	return out
}

// A large record early in a batch does not size the chunks the records
// after it are carved from.
func TestEncodeAllSizesChunksByTheBatch(t *testing.T) {
	p := engine.New(0)
	var changes []engine.Change
	for i := range 1000 {
		inv := invocation("a", 0)
		if i == 0 {
			inv.Payload = make([]byte, 1<<20)
		}
		changes = p.Invoke(changes, inv, settings(3), "", t0)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	recs, _, err := engine.EncodeAll(changes, 0, 1)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, recs, 1000)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(8<<20), "a 1 MiB payload and 999 small tasks")
}

// BenchmarkEncodeAll encodes a batch of 100 new tasks with a trace context,
// as a partition does at full load; its allocations are what the collector
// pays per batch.
func BenchmarkEncodeAll(b *testing.B) {
	p := engine.New(0)
	var changes []engine.Change
	for i := range 100 {
		inv := invocation("bench", 0)
		inv.TraceContext = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
		inv.Payload = []byte(`{"n":` + strconv.Itoa(i) + `}`)
		changes = append(changes, p.Invoke(nil, inv, settings(3), "", t0)...)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := engine.EncodeAll(changes, 0, 7); err != nil {
			b.Fatal(err)
		}
	}
}
