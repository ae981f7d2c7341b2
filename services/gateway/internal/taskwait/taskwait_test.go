package taskwait

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func record(t *testing.T, ev *eventsv1.TaskEvent) *kgo.Record {
	v, err := proto.Marshal(ev)
	require.NoError(t, err)
	return &kgo.Record{Key: []byte(ev.GetTaskId()), Value: v}
}

func TestHandlerWakesOnFinalEventsOnly(t *testing.T) {
	r := NewRegistry(10)
	h := r.Handler()
	a, releaseA, err := r.Register("a")
	require.NoError(t, err)
	defer releaseA()
	b, releaseB, err := r.Register("b")
	require.NoError(t, err)
	defer releaseB()

	garbage := &kgo.Record{Key: []byte("b"), Value: []byte("not protobuf")}
	err = h(context.Background(), []*kgo.Record{
		record(t, &eventsv1.TaskEvent{TaskId: "a", Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_STARTED, Status: flov1.TaskStatus_TASK_STATUS_RUNNING}),
		record(t, &eventsv1.TaskEvent{TaskId: "b", Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_RETRY_SCHEDULED, Status: flov1.TaskStatus_TASK_STATUS_QUEUED}),
		garbage,
		record(t, &eventsv1.TaskEvent{TaskId: "nobody-waits", Status: flov1.TaskStatus_TASK_STATUS_COMPLETED}),
	})
	var poison *kafka.PoisonError
	require.ErrorAs(t, err, &poison, "a record that does not decode is poison; the tail skips it")
	require.Same(t, garbage, poison.Record)
	require.False(t, closed(a))
	require.False(t, closed(b))

	require.NoError(t, h(context.Background(), []*kgo.Record{
		record(t, &eventsv1.TaskEvent{TaskId: "a", Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_DEAD_LETTERED, Status: flov1.TaskStatus_TASK_STATUS_DEAD_LETTERED}),
		record(t, &eventsv1.TaskEvent{TaskId: "b", Type: eventsv1.TaskEventType_TASK_EVENT_TYPE_COMPLETED}),
	}))
	require.True(t, closed(a))
	require.True(t, closed(b), "without a status the event type decides")
	require.Zero(t, r.Len(), "woken waiters are removed")
}

func TestRegistryIsBounded(t *testing.T) {
	r := NewRegistry(2)
	_, release1, err := r.Register("x")
	require.NoError(t, err)
	_, _, err = r.Register("x")
	require.NoError(t, err)
	_, _, err = r.Register("y")
	require.ErrorIs(t, err, ErrTooManyWaiters)

	release1()
	release1()
	require.Equal(t, 1, r.Len(), "releasing twice counts once")
	_, _, err = r.Register("y")
	require.NoError(t, err)
}

func TestCloseWakesEveryone(t *testing.T) {
	r := NewRegistry(10)
	a, _, err := r.Register("a")
	require.NoError(t, err)
	r.Close()
	require.True(t, closed(a))
	_, _, err = r.Register("b")
	require.ErrorIs(t, err, ErrClosed)
}
