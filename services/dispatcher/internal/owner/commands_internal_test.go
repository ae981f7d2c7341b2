package owner

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/kafka"
	eventsv1 "github.com/razorbill/flo/proto/gen/flo/events/v1"
)

// While nothing records spans, a command's trace context goes on the task as
// the invoker sent it, so the worker's handler joins the invoker's trace.
func TestAnInvocationKeepsItsInvokersTraceContext(t *testing.T) {
	id := uuid.New()
	value, err := (&eventsv1.InvokeTask{TaskId: id.String(), Namespace: "ns", Action: "a"}).MarshalVT()
	require.NoError(t, err)
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	inv, err := decodeInvocation(&kgo.Record{Value: value, Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte(parent)}}}, &kafka.TraceMemo{})
	require.NoError(t, err)
	require.Equal(t, id, inv.TaskID)
	require.Equal(t, parent, inv.TraceContext["traceparent"])
}
