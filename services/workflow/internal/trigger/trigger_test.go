package trigger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/internal/trigger"
)

func TestInputIsThePayloadOrTheArrayOfPayloads(t *testing.T) {
	t.Parallel()
	recs := []*flov1.StreamRecord{
		{Id: "1-0", Payload: []byte(`{"order_id": "ORD-1"}`)},
		{Id: "1-1", Payload: []byte("plain text")},
		{Id: "1-2", Payload: []byte{0xff, 'x'}},
		{Id: "1-3"},
	}
	require.JSONEq(t, `{"order_id": "ORD-1"}`, string(trigger.Input(recs[:1], false)))
	require.JSONEq(t, `"plain text"`, string(trigger.Input(recs[1:2], false)), "a payload that is not JSON is a JSON string")
	require.JSONEq(t, `[{"order_id": "ORD-1"}, "plain text", "\ufffdx", ""]`, string(trigger.Input(recs, true)))
	require.JSONEq(t, `[{"order_id": "ORD-1"}]`, string(trigger.Input(recs[:1], true)), "a batch of one is still an array")
}
