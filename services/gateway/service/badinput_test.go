package service_test

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

func TestBadInputOverREST(t *testing.T) {
	s := startStack(t)
	reg := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions", map[string]any{"name": "known"})
	require.Equal(t, http.StatusOK, reg.status, "%s", reg.raw)

	tests := []struct {
		name    string
		method  string
		path    string
		body    any
		status  int
		code    codes.Code
		message string
	}{
		{
			name: "unknown namespace", method: http.MethodPost, path: "/v1/namespaces/nope/actions/known/invoke",
			body: map[string]any{"input": 1}, status: http.StatusNotFound, code: codes.NotFound, message: `namespace "nope" not found`,
		},
		{
			name: "unknown action", method: http.MethodPost, path: "/v1/namespaces/default/actions/unknown/invoke",
			body: map[string]any{"input": 1}, status: http.StatusNotFound, code: codes.NotFound, message: `action "unknown" not found`,
		},
		{
			name: "malformed JSON", method: http.MethodPost, path: "/v1/namespaces/default/actions/known/invoke",
			body: `{"input": {"a": 1`, status: http.StatusBadRequest, code: codes.InvalidArgument,
		},
		{
			name: "unknown field", method: http.MethodPost, path: "/v1/namespaces/default/actions/known/invoke",
			body: `{"inptu": 1}`, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "inptu",
		},
		{
			name: "payload over the limit", method: http.MethodPost, path: "/v1/namespaces/default/actions/known/invoke",
			body:   map[string]any{"input": strings.Repeat("x", testMaxPayload)},
			status: http.StatusBadRequest, code: codes.InvalidArgument, message: "limit is 4096",
		},
		{
			name: "body over the limit", method: http.MethodPost, path: "/v1/namespaces/default/actions/known/invoke",
			body:   map[string]any{"input": strings.Repeat("x", testMaxPayload+128<<10)},
			status: http.StatusRequestEntityTooLarge, code: codes.ResourceExhausted, message: "request body is larger than",
		},
		{
			name: "negative delay", method: http.MethodPost, path: "/v1/namespaces/default/actions/known/invoke",
			body: map[string]any{"input": 1, "delayMs": -1}, status: http.StatusBadRequest, code: codes.InvalidArgument, message: "delay_ms",
		},
		{
			name: "invalid backoff", method: http.MethodPost, path: "/v1/namespaces/default/actions",
			body:   map[string]any{"name": "bad-backoff", "backoff": map[string]any{"kind": "BACKOFF_KIND_EXPONENTIAL", "initialDelayMs": -5}},
			status: http.StatusBadRequest, code: codes.InvalidArgument,
		},
		{
			name: "register in an unknown namespace", method: http.MethodPost, path: "/v1/namespaces/nope/actions",
			body: map[string]any{"name": "x"}, status: http.StatusNotFound, code: codes.NotFound, message: `namespace "nope" not found`,
		},
		{
			name: "get an unknown action", method: http.MethodGet, path: "/v1/namespaces/default/actions/unknown",
			status: http.StatusNotFound, code: codes.NotFound,
		},
		{
			name: "task id that is not a UUID", method: http.MethodGet, path: "/v1/namespaces/default/tasks/not-a-uuid",
			status: http.StatusBadRequest, code: codes.InvalidArgument, message: "not a UUID",
		},
		{
			name: "unknown task", method: http.MethodGet, path: "/v1/namespaces/default/tasks/0195c1a0-0000-7000-8000-000000000000",
			status: http.StatusNotFound, code: codes.NotFound,
		},
		{
			name: "negative await timeout", method: http.MethodGet, path: "/v1/namespaces/default/tasks/0195c1a0-0000-7000-8000-000000000000/await?timeoutMs=-1",
			status: http.StatusBadRequest, code: codes.InvalidArgument,
		},
		{
			name: "unknown route", method: http.MethodGet, path: "/v1/nothing-here",
			status: http.StatusNotFound, code: codes.NotFound,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := s.rest(t, tc.method, tc.path, tc.body)
			require.Equal(t, tc.status, resp.status, "%s", resp.raw)
			require.NotNil(t, resp.body, "the error body is JSON: %s", resp.raw)
			require.EqualValues(t, tc.code, resp.body["code"], "%s", resp.raw)
			msg, _ := resp.body["message"].(string)
			require.NotEmpty(t, msg)
			require.Contains(t, msg, tc.message)
		})
	}

	// Nothing changed: the only action is the one registered above, and no
	// command reached the log but the one invoked now.
	list, err := s.actions.ListActions(testContext(t), &flov1.ListActionsRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Len(t, list.GetActions(), 1)
	require.Equal(t, "known", list.GetActions()[0].GetName())

	// A payload of exactly the limit, base64 in "payload", is accepted.
	atLimit := s.rest(t, http.MethodPost, "/v1/namespaces/default/actions/known/invoke", map[string]any{
		"payload": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff}, testMaxPayload)),
	})
	require.Equal(t, http.StatusOK, atLimit.status, "%s", atLimit.raw)
	good, _ := atLimit.body["taskId"].(string)
	require.Equal(t, []string{good}, commandKeys(t, s.brokers))
}

func TestBadInputOverGRPC(t *testing.T) {
	s := startStack(t)
	ctx := testContext(t)
	_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "default", Name: "known"})
	require.NoError(t, err)

	tests := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"empty namespace", func() error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Action: "known"})
			return err
		}, codes.InvalidArgument},
		{"unknown namespace", func() error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "nope", Action: "known"})
			return err
		}, codes.NotFound},
		{"unknown action", func() error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: "unknown"})
			return err
		}, codes.NotFound},
		{"empty action", func() error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default"})
			return err
		}, codes.InvalidArgument},
		{"payload over the limit", func() error {
			_, err := s.tasks.InvokeTask(ctx, &flov1.InvokeTaskRequest{Namespace: "default", Action: "known", Payload: make([]byte, testMaxPayload+1)})
			return err
		}, codes.InvalidArgument},
		{"invalid backoff", func() error {
			_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: "default", Name: "bad", Backoff: &flov1.Backoff{
				Kind: flov1.BackoffKind_BACKOFF_KIND_EXPONENTIAL, InitialDelayMs: -5,
			}})
			return err
		}, codes.InvalidArgument},
		{"unknown namespace for actions", func() error {
			_, err := s.actions.ListActions(ctx, &flov1.ListActionsRequest{Namespace: "nope"})
			return err
		}, codes.NotFound},
		{"requeue an unknown task", func() error {
			_, err := s.tasks.RequeueDeadLetter(ctx, &flov1.GetTaskRequest{Namespace: "default", TaskId: "0195c1a0-0000-7000-8000-000000000000"})
			return err
		}, codes.NotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Equal(t, tc.code, status.Code(err), "error: %v", err)
			require.NotEmpty(t, status.Convert(err).Message())
		})
	}

	list, err := s.actions.ListActions(ctx, &flov1.ListActionsRequest{Namespace: "default"})
	require.NoError(t, err)
	require.Len(t, list.GetActions(), 1)
	good := invoke(t, s, "known", `{}`)
	require.Equal(t, []string{good}, commandKeys(t, s.brokers))
}
