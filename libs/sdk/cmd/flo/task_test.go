package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	flo "github.com/razorbill/flo-go"
)

// TestTaskCompleteAndFailByToken: tasks whose handler returned
// ErrResultPending are finished from the command line by their completion
// token, once each.
func TestTaskCompleteAndFailByToken(t *testing.T) {
	s := startWorkflowStack(t)
	ctx := context.Background()
	_, err := s.client.RegisterAction(ctx, "await-approval", flo.ActionOptions{MaxAttempts: 3})
	require.NoError(t, err)
	tokens := make(chan string, 2)
	w, err := s.client.NewActionWorker(flo.ActionWorkerOptions{})
	require.NoError(t, err)
	w.MustRegisterAction("await-approval", func(actx *flo.ActionContext) ([]byte, error) {
		tokens <- actx.CompletionToken()
		return nil, flo.ErrResultPending
	})
	startWorker(t, w)

	approved, err := s.client.Invoke(ctx, "await-approval", map[string]any{})
	require.NoError(t, err)
	token := <-tokens
	task := decode[map[string]any](t, s.ok(t, "task", "complete", token, `{"approved":true}`, "--outcome", "approved"))
	require.Equal(t, approved, task["id"])
	require.Equal(t, "completed", task["status"])
	require.Equal(t, map[string]any{"approved": true}, task["result"])
	require.Equal(t, "approved", task["outcome"])
	code, _, stderr := s.cli(t, "task", "complete", token)
	require.NotEqual(t, 0, code)
	require.Contains(t, stderr, "not waiting for a result")

	refused, err := s.client.Invoke(ctx, "await-approval", map[string]any{})
	require.NoError(t, err)
	token = <-tokens
	task = decode[map[string]any](t, s.ok(t, "task", "fail", token, "--error", "manager said no", "--code", "rejected"))
	require.Equal(t, refused, task["id"])
	require.Equal(t, "failed", task["status"])
	require.Equal(t, "manager said no", task["error"])
	require.Equal(t, "rejected", task["error_code"])
	require.InDelta(t, 1, task["attempt"], 0)
}
