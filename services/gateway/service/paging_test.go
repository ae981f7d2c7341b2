package service_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
)

// listCall is one public List call, by gRPC and by REST.
type listCall struct {
	name string
	// max is the largest page the call accepts.
	max int
	// grpc lists one page and returns the keys of its items.
	grpc func(ctx context.Context, limit int32, token string) ([]string, string, error)
	// path is the REST route; field names the items in its JSON answer and
	// key says what identifies one.
	path  string
	field string
	key   func(item map[string]any) string
	// want is how many items the seeded stack has.
	want int
}

// TestEveryListCallPages lists every List call's items a small page at a
// time, over gRPC and REST: every item comes exactly once and in the order
// of one big page, a limit above the call's maximum is InvalidArgument, and
// so is a page token the call did not make.
func TestEveryListCallPages(t *testing.T) {
	s := newStack(t, stackOptions{registry: true, streams: true, workflow: true})
	const ns = "default"
	seedLists(t, s, ns)

	byName := func(item map[string]any) string { return fmt.Sprint(item["name"]) }
	calls := []listCall{
		{name: "namespaces", max: 1000, path: "/v1/namespaces", field: "namespaces", key: byName, want: 5,
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.namespaces.ListNamespaces(ctx, &flov1.ListNamespacesRequest{Limit: limit, PageToken: token})
				return keysOf(r.GetNamespaces(), (*flov1.Namespace).GetName), r.GetNextPageToken(), err
			}},
		{name: "actions", max: 1000, path: "/v1/namespaces/default/actions", field: "actions", key: byName, want: 4,
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.actions.ListActions(ctx, &flov1.ListActionsRequest{Namespace: ns, Limit: limit, PageToken: token})
				return keysOf(r.GetActions(), (*flov1.Action).GetName), r.GetNextPageToken(), err
			}},
		{name: "dead letters", max: 1000, path: "/v1/namespaces/default/dead-letters?action=doomed", field: "tasks", want: 5,
			key: func(item map[string]any) string { return fmt.Sprint(item["id"]) },
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.tasks.ListDeadLetters(ctx, &flov1.ListDeadLettersRequest{Namespace: ns, Action: "doomed", Limit: limit, PageToken: token})
				return keysOf(r.GetTasks(), (*flov1.Task).GetId), r.GetNextPageToken(), err
			}},
		{name: "workers", max: 1000, path: "/v1/namespaces/default/workers", field: "workers", want: testMaxWorkers,
			key: func(item map[string]any) string { return fmt.Sprint(item["workerId"]) },
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.registry.ListWorkers(ctx, &flov1.ListWorkersRequest{Namespace: ns, Limit: limit, PageToken: token})
				return keysOf(r.GetWorkers(), (*flov1.Worker).GetWorkerId), r.GetNextPageToken(), err
			}},
		{name: "streams", max: 1000, path: "/v1/namespaces/default/streams", field: "streams", key: byName, want: 5,
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.streams.ListStreams(ctx, &flov1.ListStreamsRequest{Namespace: ns, Limit: limit, PageToken: token})
				return keysOf(r.GetStreams(), (*flov1.Stream).GetName), r.GetNextPageToken(), err
			}},
		{name: "groups", max: 1000, path: "/v1/namespaces/default/streams/s-0/groups", field: "groups", key: byName, want: 5,
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.streams.ListGroups(ctx, &flov1.ListGroupsRequest{Namespace: ns, Stream: "s-0", Limit: limit, PageToken: token})
				return keysOf(r.GetGroups(), (*flov1.ConsumerGroup).GetName), r.GetNextPageToken(), err
			}},
		{name: "pending", max: 10_000, path: "/v1/namespaces/default/streams/s-0/groups/g-0/pending", field: "entries", want: 7,
			key: func(item map[string]any) string { return fmt.Sprint(item["id"]) },
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.streams.ListPending(ctx, &flov1.ListPendingRequest{Namespace: ns, Stream: "s-0", Group: "g-0", Limit: limit, PageToken: token})
				return keysOf(r.GetEntries(), (*flov1.PendingEntry).GetId), r.GetNextPageToken(), err
			}},
		{name: "workflow versions", max: 1000, path: "/v1/namespaces/default/workflows?all_versions=true", field: "workflows", want: 6,
			key: func(item map[string]any) string { return fmt.Sprint(item["name"], "@", item["version"]) },
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.workflows.ListWorkflows(ctx, &flov1.ListWorkflowsRequest{Namespace: ns, AllVersions: true, Limit: limit, PageToken: token})
				return keysOf(r.GetWorkflows(), func(w *flov1.WorkflowDefinition) string { return w.GetName() + "@" + w.GetVersion() }),
					r.GetNextPageToken(), err
			}},
		{name: "runs", max: 1000, path: "/v1/namespaces/default/runs", field: "runs", want: 5,
			key: func(item map[string]any) string { return fmt.Sprint(item["runId"]) },
			grpc: func(ctx context.Context, limit int32, token string) ([]string, string, error) {
				r, err := s.workflows.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns, Limit: limit, PageToken: token})
				return keysOf(r.GetRuns(), (*flov1.WorkflowRun).GetRunId), r.GetNextPageToken(), err
			}},
	}
	// A token of a shape no call makes, and one that is not a token at all.
	badTokens := []string{"garbage!", base64.RawURLEncoding.EncodeToString([]byte(`["a","b","c","d"]`))}

	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			ctx := testContext(t)
			whole, next, err := c.grpc(ctx, int32(c.max), "")
			require.NoError(t, err, "a page of the maximum size")
			require.Empty(t, next)
			require.GreaterOrEqual(t, len(whole), c.want)
			require.Equal(t, whole, grpcPages(t, c), "gRPC pages of 2")
			require.Equal(t, whole, restPages(t, s, c), "REST pages of 2")

			_, _, err = c.grpc(ctx, int32(c.max+1), "")
			requireInvalid(t, err, "limit")
			_, _, err = c.grpc(ctx, -1, "")
			requireInvalid(t, err, "limit")
			resp := s.rest(t, http.MethodGet, withQuery(c.path, fmt.Sprintf("limit=%d", c.max+1)), nil)
			require.Equal(t, http.StatusBadRequest, resp.status, "%s", resp.raw)
			require.Contains(t, resp.body["message"], "limit")
			for _, tok := range badTokens {
				_, _, err = c.grpc(ctx, 2, tok)
				requireInvalid(t, err, "page_token")
				resp := s.rest(t, http.MethodGet, withQuery(c.path, "page_token="+url.QueryEscape(tok)), nil)
				require.Equal(t, http.StatusBadRequest, resp.status, "%s", resp.raw)
				require.Contains(t, resp.body["message"], "page_token")
			}
		})
	}
}

func keysOf[T any](items []T, key func(T) string) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = key(it)
	}
	return out
}

func requireInvalid(t *testing.T, err error, field string) {
	t.Helper()
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), field)
}

func withQuery(path, query string) string {
	if strings.Contains(path, "?") {
		return path + "&" + query
	}
	return path + "?" + query
}

// grpcPages lists every page of c over gRPC, two items at a time.
func grpcPages(t *testing.T, c listCall) []string {
	t.Helper()
	var all []string
	token := ""
	for range 100 {
		keys, next, err := c.grpc(testContext(t), 2, token)
		require.NoError(t, err)
		require.LessOrEqual(t, len(keys), 2)
		all = append(all, keys...)
		if next == "" {
			return all
		}
		token = next
	}
	require.FailNow(t, "the pages never ended")
	return nil
}

// restPages lists every page of c over REST, two items at a time.
func restPages(t *testing.T, s *stack, c listCall) []string {
	t.Helper()
	var all []string
	token := ""
	for range 100 {
		resp := s.rest(t, http.MethodGet, withQuery(c.path, "limit=2&page_token="+url.QueryEscape(token)), nil)
		require.Equal(t, http.StatusOK, resp.status, "%s", resp.raw)
		items, _ := resp.body[c.field].([]any)
		require.LessOrEqual(t, len(items), 2)
		for _, it := range items {
			all = append(all, c.key(it.(map[string]any)))
		}
		next, _ := resp.body["nextPageToken"].(string)
		if next == "" {
			return all
		}
		token = next
	}
	require.FailNow(t, "the pages never ended")
	return nil
}

// seedLists gives every List call of namespace ns more than two pages of
// two: namespaces, actions, dead letters of "doomed", workers, streams,
// groups and pending records of s-0/g-0, workflow versions and runs.
func seedLists(t *testing.T, s *stack, ns string) {
	t.Helper()
	ctx := testContext(t)
	for i := range 4 {
		_, err := s.namespaces.CreateNamespace(ctx, &flov1.CreateNamespaceRequest{Name: fmt.Sprintf("ns-%d", i)})
		require.NoError(t, err)
	}
	for _, a := range append([]string{"doomed"}, orderActions...) {
		_, err := s.actions.RegisterAction(ctx, &flov1.RegisterActionRequest{Namespace: ns, Name: a})
		require.NoError(t, err)
	}
	for i := range testMaxWorkers {
		_, err := s.registry.RegisterWorker(ctx, &flov1.RegisterWorkerRequest{Namespace: ns, WorkerId: fmt.Sprintf("w-%d", i), WorkerType: flov1.WorkerType_WORKER_TYPE_ACTION})
		require.NoError(t, err)
	}
	seedDeadLetters(t, s, ns, 5)

	for i := range 5 {
		_, err := s.streams.CreateStream(ctx, &flov1.CreateStreamRequest{Namespace: ns, Name: fmt.Sprintf("s-%d", i), Partitions: 2})
		require.NoError(t, err)
		_, err = s.streams.CreateGroup(ctx, &flov1.CreateGroupRequest{Namespace: ns, Stream: "s-0", Name: fmt.Sprintf("g-%d", i)})
		require.NoError(t, err)
	}
	// Records with different keys land on both partitions; reading them
	// in two reads makes more than one pending range.
	records := make([]*flov1.AppendRecord, 7)
	for i := range records {
		records[i] = &flov1.AppendRecord{Payload: []byte(`{}`), Key: fmt.Sprintf("k%d", i)}
	}
	_, err := s.streams.Append(ctx, &flov1.AppendRequest{Namespace: ns, Stream: "s-0", Records: records})
	require.NoError(t, err)
	read := 0
	for read < len(records) {
		got, err := s.streams.GroupRead(ctx, &flov1.GroupReadRequest{Namespace: ns, Stream: "s-0", Group: "g-0", Consumer: "c", Count: 3, BlockMs: 5000})
		require.NoError(t, err)
		read += len(got.GetRecords())
	}

	yaml := processOrderYAML(t)
	define := func(name, version string) {
		def := strings.Replace(strings.Replace(yaml, "name: process-order", "name: "+name, 1), `version: "1.0.0"`, `version: "`+version+`"`, 1)
		_, err := s.workflows.CreateWorkflow(ctx, &flov1.CreateWorkflowRequest{Namespace: ns, Yaml: def})
		require.NoError(t, err)
	}
	for i := range 5 {
		define(fmt.Sprintf("wf-%d", i), "1.0.0")
	}
	define("wf-0", "2.0.0")
	for i := range 5 {
		_, err := s.workflows.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "wf-1", IdempotencyKey: fmt.Sprintf("run-%d", i)})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		r, err := s.workflows.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns})
		return err == nil && len(r.GetRuns()) == 5
	}, wait, 20*time.Millisecond, "the runs never showed")
}

// seedDeadLetters invokes n tasks of the action "doomed" and fails each
// without retry, which dead-letters it.
func seedDeadLetters(t *testing.T, s *stack, ns string, n int) {
	t.Helper()
	ctx := testContext(t)
	invokes := make([]*flov1.InvokeTaskRequest, n)
	for i := range invokes {
		invokes[i] = &flov1.InvokeTaskRequest{Namespace: ns, Action: "doomed", Payload: []byte(`{}`)}
	}
	_, err := s.tasks.InvokeTasks(ctx, &flov1.InvokeTasksRequest{Namespace: ns, Tasks: invokes})
	require.NoError(t, err)
	for failed := 0; failed < n; {
		claimed, err := s.dispatcher.Claim(ctx, &dispatcherv1.ClaimRequest{Namespace: ns, Slots: []*dispatcherv1.ClaimSlot{{WorkerId: "w-0", Count: int32(n)}}, Actions: []string{"doomed"}, WaitMs: 5000})
		require.NoError(t, err)
		reports := make([]*dispatcherv1.Report, len(claimed.GetTasks()))
		for i, a := range claimed.GetTasks() {
			reports[i] = &dispatcherv1.Report{TaskId: a.GetTaskId(), Attempt: a.GetAttempt(),
				Kind: &dispatcherv1.Report_Failed{Failed: &flov1.Failed{Error: "doomed"}}}
		}
		if len(reports) > 0 {
			_, err = s.dispatcher.Report(ctx, &dispatcherv1.ReportRequest{Namespace: ns, WorkerId: "w-0", Reports: reports})
			require.NoError(t, err)
		}
		failed += len(reports)
	}
	require.Eventually(t, func() bool {
		r, err := s.tasks.ListDeadLetters(ctx, &flov1.ListDeadLettersRequest{Namespace: ns, Action: "doomed"})
		return err == nil && len(r.GetTasks()) == n
	}, wait, 20*time.Millisecond, "the tasks never reached dead letters")
}
