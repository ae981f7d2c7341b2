package engine_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/dispatcher/internal/engine"
	"github.com/razorbill/flo/services/dispatcher/internal/store"
	"github.com/razorbill/flo/services/dispatcher/internal/taskevent"
)

// payloadOf is task i's payload: 100 bytes that name it.
func payloadOf(i int) []byte {
	return fmt.Appendf(nil, "%-100d", i)
}

// invokeMany creates n tasks with payloadOf(i), records each at offset i
// and returns their ids in invocation order.
func invokeMany(t *testing.T, p *engine.Partition, n int) []uuid.UUID {
	t.Helper()
	ids := make([]uuid.UUID, n)
	for i := range n {
		inv := invocation("send", 0)
		inv.Payload, inv.InvokedAt = payloadOf(i), at(time.Duration(i))
		changes := p.Invoke(nil, inv, settings(3), "", t0)
		require.Len(t, changes, 1)
		p.Recorded(inv.TaskID, int64(i))
		ids[i] = inv.TaskID
	}
	return ids
}

// heldBytes adds up the payloads p holds of ids, checking that every task
// either holds its payload or says it let it go.
func heldBytes(t *testing.T, p *engine.Partition, ids []uuid.UUID) int64 {
	t.Helper()
	var n int64
	for i, id := range ids {
		task := get(t, p, id)
		if task.PayloadOut {
			require.Empty(t, task.Payload)
			continue
		}
		require.Equal(t, payloadOf(i), task.Payload)
		n += int64(len(task.Payload))
	}
	return n
}

func TestPayloadsBeyondTheBoundGoOnceTheViewHasThem(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	const bound = 4 << 10
	p.SetLimits(engine.Limits{PayloadBytes: bound})
	ids := invokeMany(t, p, 100)

	require.EqualValues(t, 100*100, p.PayloadBytes(), "nothing goes before the view has it")
	require.EqualValues(t, 100*100, heldBytes(t, p, ids))

	p.Materialized(49)
	require.EqualValues(t, 50*100, p.PayloadBytes(), "only what the view has goes: the first 50")
	require.EqualValues(t, 50*100, heldBytes(t, p, ids))
	for _, id := range ids[50:] {
		require.False(t, get(t, p, id).PayloadOut)
	}

	p.Materialized(99)
	require.LessOrEqual(t, p.PayloadBytes(), int64(bound))
	require.Equal(t, heldBytes(t, p, ids), p.PayloadBytes())
	kept := int(p.PayloadBytes() / 100)
	require.Positive(t, kept)

	// The state of every task is unchanged: all 100 are claimable, in
	// order; those whose payload went come out flagged for a read of it.
	require.Equal(t, 100, p.Ready(ns, "send", t0))
	claimed, changes := p.Claim(ns, []string{"send"}, make([]engine.Slot, 100), t0)
	require.Len(t, claimed, 100)
	require.Len(t, changes, 100)
	out := 0
	for i, c := range claimed {
		require.Equal(t, ids[i], c.Task.ID)
		require.Equal(t, store.Running, c.Task.Status)
		if c.Task.PayloadOut {
			out++
			require.Empty(t, c.Task.Payload)
			continue
		}
		require.Equal(t, payloadOf(i), c.Task.Payload)
	}
	require.Equal(t, 100-kept, out)
	require.Equal(t, heldBytes(t, p, ids), p.PayloadBytes())

	// Finished and let go, the tasks take their payloads with them.
	for i, c := range claimed {
		ok, changes := p.Report(nil, ns, engine.Report{TaskID: c.Task.ID.String(), Attempt: 1, Kind: engine.Complete}, t0)
		require.True(t, ok)
		p.Recorded(changes[0].Task.ID, int64(200+i))
	}
	p.Materialized(299)
	require.Zero(t, p.Len())
	require.Zero(t, p.PayloadBytes())
}

func TestPayloadsKeptUnderTheBound(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	p.SetLimits(engine.Limits{PayloadBytes: 100 * 100, Horizon: time.Minute})
	ids := invokeMany(t, p, 100)
	p.Materialized(99)
	require.EqualValues(t, 100*100, p.PayloadBytes())
	require.EqualValues(t, 100*100, heldBytes(t, p, ids))
}

func TestFarFuturePayloadsGo(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	p.SetLimits(engine.Limits{Horizon: time.Minute})
	soon, later := invocation("send", 0), invocation("send", 0)
	soon.RunAt, later.RunAt = at(30*time.Second), at(time.Hour)
	for i, inv := range []engine.Invocation{soon, later} {
		require.Len(t, p.Invoke(nil, inv, settings(3), "", t0), 1)
		p.Recorded(inv.TaskID, int64(i))
	}
	p.Materialized(0)
	require.False(t, get(t, p, later.TaskID).PayloadOut, "not before the view has it")
	p.Materialized(1)
	require.False(t, get(t, p, soon.TaskID).PayloadOut)
	require.True(t, get(t, p, later.TaskID).PayloadOut)
	require.EqualValues(t, len(soon.Payload), p.PayloadBytes())

	// Come due, it is claimed like any other, flagged for its payload.
	claimed, _ := p.Claim(ns, []string{"send"}, make([]engine.Slot, 2), at(time.Hour))
	require.Len(t, claimed, 2)
	require.Equal(t, []bool{false, true}, []bool{claimed[0].Task.PayloadOut, claimed[1].Task.PayloadOut})
}

func TestRequeueNeedsThePayloadBack(t *testing.T) {
	t.Parallel()
	p := engine.New(0)
	p.SetLimits(engine.Limits{PayloadBytes: 1})
	task := running(t, p, 1, t0)
	p.Recorded(task.ID, 0)
	p.Materialized(0)
	require.True(t, get(t, p, task.ID).PayloadOut, "a running task's payload goes too")
	ok, changes := p.Report(nil, ns, engine.Report{TaskID: task.ID.String(), Attempt: 1, Kind: engine.Fail}, t0)
	require.True(t, ok)
	require.Equal(t, taskevent.DeadLettered, changes[0].Type)
	p.Recorded(task.ID, 1)
	dead := get(t, p, task.ID)
	require.True(t, dead.PayloadOut)
	require.Zero(t, p.PayloadBytes())

	_, _, err := p.Requeue(ns, task.ID, at(time.Second))
	require.ErrorIs(t, err, engine.ErrPayloadOut)

	// The task as the view has it gives the payload back, nothing else.
	fromView := dead
	fromView.Payload, fromView.PayloadOut, fromView.Attempt = task.Payload, false, 7
	p.Load(fromView)
	back := get(t, p, task.ID)
	require.Equal(t, task.Payload, back.Payload)
	require.False(t, back.PayloadOut)
	require.Equal(t, int32(1), back.Attempt)
	require.EqualValues(t, len(task.Payload), p.PayloadBytes())

	got, changes, err := p.Requeue(ns, task.ID, at(time.Second))
	require.NoError(t, err)
	require.Equal(t, task.Payload, got.Payload)
	recs, _, err := engine.EncodeAll([]engine.Change{changes[0]}, 0, 0)
	require.NoError(t, err)
	rec := recs[0]
	decoded, _, err := engine.Decode(rec)
	require.NoError(t, err)
	require.True(t, bytes.Equal(task.Payload, decoded.Task.Payload), "the Requeued record carries the payload")
}

// A partition rebuilt from the log keeps track of payloads the live one let
// go: a replayed change that carries none keeps the held task's.
func TestReplayKeepsPayloadsOut(t *testing.T) {
	t.Parallel()
	limits := engine.Limits{PayloadBytes: 250}
	live, copy := engine.New(0), engine.New(0)
	live.SetLimits(limits)
	copy.SetLimits(limits)
	var off int64
	record := func(changes []engine.Change) {
		for _, c := range changes {
			recs, _, err := engine.EncodeAll([]engine.Change{c}, 0, 0)
			require.NoError(t, err)
			rec := recs[0]
			decoded, _, err := engine.Decode(rec)
			require.NoError(t, err)
			copy.Apply(decoded)
			live.Recorded(c.Task.ID, off)
			copy.Recorded(c.Task.ID, off)
			off++
		}
	}
	var ids []uuid.UUID
	for i := range 5 {
		inv := invocation("send", 0)
		inv.Payload = payloadOf(i)
		ids = append(ids, inv.TaskID)
		record(live.Invoke(nil, inv, settings(3), "", t0))
	}
	live.Materialized(off - 1)
	copy.Materialized(off - 1)
	_, changes := live.Claim(ns, []string{"send"}, make([]engine.Slot, 5), t0)
	record(changes)
	for _, id := range ids {
		a, b := get(t, live, id), get(t, copy, id)
		require.Equal(t, normal(a), normal(b))
	}
	require.Equal(t, live.PayloadBytes(), copy.PayloadBytes())
	require.LessOrEqual(t, live.PayloadBytes(), int64(250))
	require.EqualValues(t, 200, live.PayloadBytes())
}

// A rebuild loads from the view without the payloads the bound would not
// keep (view.LoadLive): such a task holds no payload bytes, a claim of it
// says the payload is out, and the task as the view has it gives the
// payload back; loading it again without one takes nothing away.
func TestLoadedWithoutItsPayload(t *testing.T) {
	t.Parallel()
	src := engine.New(0)
	id := invoke(t, src, "send", 3, t0)
	fromView := get(t, src, id)
	payload := fromView.Payload
	require.NotEmpty(t, payload)

	p := engine.New(0)
	p.SetLimits(engine.Limits{PayloadBytes: 1 << 20})
	out := fromView
	out.PayloadOut = true
	p.Load(out)
	require.Zero(t, p.PayloadBytes())
	held := get(t, p, id)
	require.True(t, held.PayloadOut)
	require.Empty(t, held.Payload)
	require.Equal(t, 1, p.Ready(ns, "send", t0), "queued as it was")

	p.Load(out)
	require.True(t, get(t, p, id).PayloadOut, "a load without the payload leaves it out")
	p.Load(fromView)
	require.Equal(t, payload, get(t, p, id).Payload)
	require.EqualValues(t, len(payload), p.PayloadBytes())

	q := engine.New(0)
	q.Load(out)
	claimed := claimOne(t, q, "send", t0)
	require.True(t, claimed.PayloadOut, "the claim reads the payload from the view")
	require.Empty(t, claimed.Payload)
}
