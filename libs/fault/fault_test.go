package fault_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/libs/fault"
)

func TestKindOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		err     error
		kind    fault.Kind
		message string
		ok      bool
	}{
		{name: "not found", err: fault.NotFoundf("task %s not found", "t1"), kind: fault.NotFound, message: "task t1 not found", ok: true},
		{name: "invalid", err: fault.Invalidf("limit must not be negative"), kind: fault.Invalid, message: "limit must not be negative", ok: true},
		{name: "precondition", err: fault.Preconditionf("task is running"), kind: fault.Precondition, message: "task is running", ok: true},
		{name: "exhausted", err: fault.Exhaustedf("limit is %d", 3), kind: fault.Exhausted, message: "limit is 3", ok: true},
		{name: "wrapped", err: fmt.Errorf("get task: %w", fault.NotFoundf("gone")), kind: fault.NotFound, message: "gone", ok: true},
		{name: "plain", err: errors.New("boom")},
		{name: "nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kind, message, ok := fault.KindOf(tt.err)
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.kind, kind)
			require.Equal(t, tt.message, message)
		})
	}
}
