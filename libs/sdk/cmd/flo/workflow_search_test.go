package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// searchOrdersYAML holds the reference's searchAttributes section.
const searchOrdersYAML = `kind: Workflow
name: search-orders
version: "1"
searchAttributes:
  - name: customer_id
    type: string
    from: input.customer_id
  - name: order_amount
    type: number
    from: input.amount
  - name: created_at
    type: timestamp
    from: input.timestamp
start:
  waitForSignal: {type: go, timeoutMs: 600000}
  transitions: {success: flo.Completed}
`

// TestWorkflowSearchAttributes: `flo workflow status` shows a run's search attributes, `flo
// workflow runs --where` and RunFilter.Where list by them, and a bad query or input says what
// is wrong.
func TestWorkflowSearchAttributes(t *testing.T) {
	s := startWorkflowStack(t)
	s.ok(t, "workflow", "create", "-f", writeFile(t, "orders.yaml", searchOrdersYAML))
	big := decode[flo.StartedRun](t, s.ok(t, "workflow", "start", "search-orders",
		`{"customer_id": "c-42", "amount": 150, "timestamp": "2026-01-31T12:00:00Z"}`)).RunID
	s.ok(t, "workflow", "start", "search-orders", `{"customer_id": "c-42", "amount": 50}`)
	s.ok(t, "workflow", "start", "search-orders", `{"customer_id": "c-7", "amount": 500}`)

	status := decode[struct {
		Attributes map[string]any `json:"search_attributes"`
	}](t, s.ok(t, "workflow", "status", big))
	require.Equal(t, map[string]any{"customer_id": "c-42", "order_amount": float64(150), "created_at": "2026-01-31T12:00:00Z"}, status.Attributes)

	listed := decode[struct {
		Runs []cliRun `json:"runs"`
	}](t, s.ok(t, "workflow", "runs", "--where", `customer_id = "c-42" AND order_amount > 100`))
	require.Len(t, listed.Runs, 1)
	require.Equal(t, big, listed.Runs[0].RunID)

	runs, _, err := s.client.ListRuns(t.Context(), flo.RunFilter{Where: `order_amount IN (50, 500)`})
	require.NoError(t, err)
	require.Len(t, runs, 2)
	for _, r := range runs {
		a, ok := r.SearchAttribute("order_amount")
		require.True(t, ok)
		require.Contains(t, []any{50.0, 500.0}, a.Value())
	}
	run, err := s.client.GetRun(t.Context(), big)
	require.NoError(t, err)
	at, ok := run.SearchAttribute("created_at")
	require.True(t, ok)
	require.Equal(t, time.Date(2026, 1, 31, 12, 0, 0, 0, time.UTC), at.Value())

	code, _, stderr := s.cli(t, "workflow", "runs", "--where", `custmer_id = "c-42"`)
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, `where: at 1: unknown attribute "custmer_id"`)
	code, _, stderr = s.cli(t, "workflow", "start", "search-orders", `{"amount": "lots"}`)
	require.NotEqual(t, 0, code)
	require.True(t, strings.Contains(stderr, "search attribute order_amount"), stderr)
}
