package service_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/razorbill/flo/libs/harness"
	flov1 "github.com/razorbill/flo/proto/gen/flo/v1"
	"github.com/razorbill/flo/services/workflow/service"
)

// ordersYAML declares the reference's search attributes; %s is the
// version and %s extra attributes.
const ordersYAML = `kind: Workflow
name: orders
version: "%s"
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
%s
start:
  waitForSignal: {type: go}
  transitions: {success: flo.Completed}
`

const refundsYAML = `kind: Workflow
name: refunds
version: "1"
searchAttributes:
  - {name: customer_id, type: string, from: input.customer}
  - {name: reason, type: string, from: input.reason}
start:
  waitForSignal: {type: go}
  transitions: {success: flo.Completed}
`

const parentOfOrdersYAML = `kind: Workflow
name: parent
version: "1"
start:
  run: "@workflow/orders"
  inputMapping: '{"customer_id": "$.input.customer", "amount": "$.input.amount"}'
  transitions: {success: flo.Completed, failure: flo.Failed}
`

// searchRun is what the test knows of a run it started, to filter in Go
// what the service must filter in SQL.
type searchRun struct {
	id, workflow, status string
	customer             *string
	amount               *float64
	created              *time.Time
	reason, region       string
	startedAt            time.Time
}

// TestSearchAttributes: runs take typed attributes from their input (start
// calls and children), show them in their status, and are listed by queries
// of every operator, built-in fields too, exactly as a Go filter over the
// inputs says, a page at a time; bad inputs and bad queries get clear
// errors.
func TestSearchAttributes(t *testing.T) {
	e := startEnv(t)
	ns := e.namespace(t)
	c := e.client()
	ctx := t.Context()
	e.create(t, ns, fmt.Sprintf(ordersYAML, "1", ""))
	e.create(t, ns, fmt.Sprintf(ordersYAML, "2", "  - {name: region, type: string, from: input.region}"))
	e.create(t, ns, refundsYAML)
	e.create(t, ns, parentOfOrdersYAML)

	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var runs []*searchRun
	var mid time.Time
	for i := range 30 {
		r := &searchRun{workflow: "orders", status: "waiting", region: "eu"}
		input := map[string]any{"region": "eu"}
		if i%5 != 4 {
			s := fmt.Sprintf("c-%d", i%5)
			r.customer, input["customer_id"] = &s, s
		}
		if i%7 != 0 {
			a := float64(i*10) + 0.5
			r.amount, input["amount"] = &a, a
		}
		if i%6 != 0 {
			ts := base.Add(time.Duration(i) * time.Hour)
			r.created = &ts
			if i%2 == 0 {
				input["timestamp"] = ts.UnixMilli()
			} else {
				input["timestamp"] = ts.Format(time.RFC3339)
			}
		}
		r.id = e.start(t, ns, "orders", jsonText(t, input), "")
		runs = append(runs, r)
		if i == 14 {
			mid = time.Now()
		}
	}
	for i := range 6 {
		s := fmt.Sprintf("c-%d", i%3)
		r := &searchRun{workflow: "refunds", status: "waiting", customer: &s, reason: []string{"late", "damaged"}[i%2]}
		r.id = e.start(t, ns, "refunds", fmt.Sprintf(`{"customer": %q, "reason": %q}`, s, r.reason), "")
		runs = append(runs, r)
	}
	e.start(t, ns, "parent", `{"customer": "c-child", "amount": 5}`, "")
	badParent := e.start(t, ns, "parent", `{"customer": "c-bad", "amount": "five"}`, "")
	for i, r := range runs {
		if i%4 == 0 {
			_, err := c.CancelRun(ctx, &flov1.CancelRunRequest{Namespace: ns, RunId: r.id})
			require.NoError(t, err)
			r.status = "cancelled"
		}
		got := e.run(t, ns, r.id)
		r.startedAt = got.GetCreatedAt().AsTime()
	}

	// The status shows the attributes, typed.
	got := e.run(t, ns, runs[2].id)
	attrs := map[string]*flov1.SearchAttribute{}
	for _, a := range got.GetSearchAttributes() {
		attrs[a.GetName()] = a
	}
	require.Len(t, attrs, 4)
	require.Equal(t, "c-2", attrs["customer_id"].GetStringValue())
	require.Equal(t, 20.5, attrs["order_amount"].GetNumberValue())
	require.Equal(t, base.Add(2*time.Hour), attrs["created_at"].GetTimestampValue().AsTime())
	require.Equal(t, "eu", attrs["region"].GetStringValue())
	require.Len(t, e.run(t, ns, runs[0].id).GetSearchAttributes(), 2, "missing values are absent")

	// A child takes its attributes from its own input; one whose input does
	// not fit does not start, and its parent's step fails.
	child := listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Where: `customer_id = "c-child" AND order_amount = 5`})
	require.Len(t, child, 1)
	require.Equal(t, "orders", child[0].GetWorkflow())
	childCustomer, childAmount := "c-child", 5.0
	runs = append(runs, &searchRun{
		id: child[0].GetRunId(), workflow: "orders", status: "waiting", customer: &childCustomer, amount: &childAmount,
		startedAt: child[0].GetCreatedAt().AsTime(),
	})
	failed := e.waitRun(t, ns, badParent, stFailed)
	var reasons []string
	for _, ev := range e.history(t, ns, badParent) {
		reasons = append(reasons, ev.GetDetail())
	}
	require.Contains(t, strings.Join(reasons, "\n"), `child workflow orders not started: search attribute order_amount (number, from $.input.amount): the string "five" is not a number`)
	runs = append(runs, &searchRun{
		id: badParent, workflow: "parent", status: "failed", startedAt: failed.GetCreatedAt().AsTime(),
	})
	require.Empty(t, listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Where: `customer_id = "c-bad"`}))

	ts := func(h int) string { return base.Add(time.Duration(h) * time.Hour).Format(time.RFC3339) }
	str := func(p *string) string {
		if p == nil {
			return "\x00"
		}
		return *p
	}
	is := func(p *string, vs ...string) bool { return p != nil && slices.Contains(vs, *p) }
	num := func(r *searchRun, f func(float64) bool) bool { return r.amount != nil && f(*r.amount) }
	at := func(r *searchRun, f func(time.Time) bool) bool { return r.created != nil && f(*r.created) }
	tests := []struct {
		where string
		want  func(r *searchRun) bool
	}{
		{`customer_id = "c-2"`, func(r *searchRun) bool { return is(r.customer, "c-2") }},
		{`customer_id != "c-2"`, func(r *searchRun) bool { return r.customer != nil && *r.customer != "c-2" }},
		{`customer_id < "c-2"`, func(r *searchRun) bool { return r.customer != nil && str(r.customer) < "c-2" }},
		{`customer_id >= "c-2"`, func(r *searchRun) bool { return r.customer != nil && str(r.customer) >= "c-2" }},
		{`customer_id IN ("c-1", "c-3", "nobody")`, func(r *searchRun) bool { return is(r.customer, "c-1", "c-3") }},
		{`order_amount = 100.5`, func(r *searchRun) bool { return num(r, func(a float64) bool { return a == 100.5 }) }},
		{`order_amount != 100.5`, func(r *searchRun) bool { return num(r, func(a float64) bool { return a != 100.5 }) }},
		{`order_amount < 100`, func(r *searchRun) bool { return num(r, func(a float64) bool { return a < 100 }) }},
		{`order_amount <= 100.5`, func(r *searchRun) bool { return num(r, func(a float64) bool { return a <= 100.5 }) }},
		{`order_amount > 200`, func(r *searchRun) bool { return num(r, func(a float64) bool { return a > 200 }) }},
		{`order_amount >= 200.5`, func(r *searchRun) bool { return num(r, func(a float64) bool { return a >= 200.5 }) }},
		{`order_amount IN (10.5, 20.5, 7)`, func(r *searchRun) bool { return num(r, func(a float64) bool { return a == 10.5 || a == 20.5 }) }},
		{`created_at >= "` + ts(10) + `"`, func(r *searchRun) bool {
			return at(r, func(x time.Time) bool { return !x.Before(base.Add(10 * time.Hour)) })
		}},
		{fmt.Sprintf(`created_at < %d`, base.Add(9*time.Hour).UnixMilli()), func(r *searchRun) bool {
			return at(r, func(x time.Time) bool { return x.Before(base.Add(9 * time.Hour)) })
		}},
		{`created_at IN ("` + ts(3) + `", "` + ts(5) + `")`, func(r *searchRun) bool {
			return at(r, func(x time.Time) bool { return x.Equal(base.Add(3*time.Hour)) || x.Equal(base.Add(5*time.Hour)) })
		}},
		{`customer_id = "c-2" AND order_amount > 100`, func(r *searchRun) bool {
			return is(r.customer, "c-2") && num(r, func(a float64) bool { return a > 100 })
		}},
		{`customer_id = "c-1" OR customer_id = "c-2" AND order_amount > 100`, func(r *searchRun) bool {
			return is(r.customer, "c-1") || is(r.customer, "c-2") && num(r, func(a float64) bool { return a > 100 })
		}},
		{`(customer_id = "c-1" OR customer_id = "c-2") AND order_amount > 100`, func(r *searchRun) bool {
			return is(r.customer, "c-1", "c-2") && num(r, func(a float64) bool { return a > 100 })
		}},
		{`reason = "late" OR workflow = "orders" AND order_amount < 50`, func(r *searchRun) bool {
			return r.reason == "late" || r.workflow == "orders" && num(r, func(a float64) bool { return a < 50 })
		}},
		{`workflow = "refunds"`, func(r *searchRun) bool { return r.workflow == "refunds" }},
		{`workflow != "refunds" AND customer_id = "c-0"`, func(r *searchRun) bool { return r.workflow != "refunds" && is(r.customer, "c-0") }},
		{`status = "cancelled"`, func(r *searchRun) bool { return r.status == "cancelled" }},
		{`status IN ("waiting") AND customer_id = "c-1"`, func(r *searchRun) bool { return r.status == "waiting" && is(r.customer, "c-1") }},
		{`started_at > "` + mid.UTC().Format(time.RFC3339Nano) + `" AND workflow = "orders"`, func(r *searchRun) bool {
			return r.workflow == "orders" && r.startedAt.After(mid)
		}},
		{`finished_at >= "2000-01-01T00:00:00Z"`, func(r *searchRun) bool { return r.status == "cancelled" || r.status == "failed" }},
		{`finished_at < "2000-01-01T00:00:00Z" OR started_at < "2000-01-01T00:00:00Z"`, func(*searchRun) bool { return false }},
		{`workflow = "orders" AND region = "eu" AND order_amount <= 30.5`, func(r *searchRun) bool {
			return r.workflow == "orders" && r.region == "eu" && num(r, func(a float64) bool { return a <= 30.5 })
		}},
	}
	for _, tc := range tests {
		var want []string
		for _, r := range runs {
			if tc.want(r) {
				want = append(want, r.id)
			}
		}
		var gotIDs []string
		for _, r := range listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Where: tc.where, Limit: 1000}) {
			gotIDs = append(gotIDs, r.GetRunId())
		}
		require.ElementsMatch(t, want, gotIDs, tc.where)
	}

	// Paging through a filtered list: pages of 4, newest first, no gaps or
	// repeats, the same runs as one page holds.
	where := `customer_id IN ("c-0", "c-1", "c-2", "c-3") AND workflow = "orders"`
	var whole []string
	for _, r := range listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Where: where, Limit: 1000}) {
		whole = append(whole, r.GetRunId())
	}
	var paged []string
	token := ""
	for range 20 {
		resp, err := c.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns, Where: where, Limit: 4, PageToken: token})
		require.NoError(t, err)
		require.LessOrEqual(t, len(resp.GetRuns()), 4)
		for _, r := range resp.GetRuns() {
			paged = append(paged, r.GetRunId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	require.Len(t, whole, 24, "the orders of c-0…c-3")
	require.Equal(t, whole, paged)

	// A value of the wrong type refuses the start, naming the attribute.
	_, err := c.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "orders", Input: []byte(`{"amount": "12"}`)})
	requireCode(t, codes.InvalidArgument, err, `search attribute order_amount (number, from $.input.amount): the string "12" is not a number`)
	_, err = c.StartRun(ctx, &flov1.StartRunRequest{Namespace: ns, Workflow: "orders", Input: []byte(`{"timestamp": "last tuesday"}`)})
	requireCode(t, codes.InvalidArgument, err, "search attribute created_at")

	// Bad queries say what and where.
	for _, tc := range []struct{ where, msg string }{
		{`custmer_id = "x"`, `where: at 1: unknown attribute "custmer_id"`},
		{`workflow = "refunds" AND region = "eu"`, `where: at 26: unknown attribute "region"`},
		{`order_amount = "ten"`, `where: at 16: type mismatch: the string "ten" is not a number`},
		{`customer_id = 42`, `where: at 15: type mismatch: the number 42 is not a string`},
		{`customer_id = `, "where: at 15: expected a value"},
		{`status = "done"`, `where: at 10: status "done" is not one of`},
	} {
		_, err := c.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns, Where: tc.where})
		requireCode(t, codes.InvalidArgument, err, tc.msg)
	}
	_, err = c.ListRuns(ctx, &flov1.ListRunsRequest{Namespace: ns, Workflow: "refunds", Where: `region = "eu"`})
	requireCode(t, codes.InvalidArgument, err, `unknown attribute "region"`)
}

func jsonText(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// TestScheduledRunSearchAttributes: a run a schedule starts takes its
// attributes from the schedule's input like any other.
func TestScheduledRunSearchAttributes(t *testing.T) {
	t.Parallel()
	clock := harness.NewClock(time.Date(2026, 3, 1, 10, 2, 30, 0, time.UTC))
	broker := harness.NewBroker(t)
	e := &env{dbURL: harness.NewDatabase(t), brokers: broker.Addrs()}
	e.dispatcher = startDispatcher(t, e.dbURL, e.brokers)
	e.wf = startWorkflowWith(t, e.dbURL, e.brokers, testLog(), []service.Option{service.WithClock(clock.Now)}, scheduleTick(20*time.Millisecond))
	ns := e.namespace(t)
	e.create(t, ns, `kind: Workflow
name: nightly
version: "1"
searchAttributes:
  - {name: mode, type: string, from: input.mode}
  - {name: batch, type: number, from: input.batch}
schedule:
  cron: "0 * * * *"
  input: '{"mode": "full", "batch": 7}'
start:
  waitForSignal: {type: go}
  transitions: {success: flo.Completed}
`)
	clock.Set(time.Date(2026, 3, 1, 11, 0, 1, 0, time.UTC))
	var runs []*flov1.WorkflowRun
	require.Eventually(t, func() bool {
		runs = listRuns(t, e, &flov1.ListRunsRequest{Namespace: ns, Where: `mode = "full" AND batch = 7 AND workflow = "nightly"`})
		return len(runs) == 1
	}, waitFor, tick)
	attrs := runs[0].GetSearchAttributes()
	require.Len(t, attrs, 2)
	require.Equal(t, "batch", attrs[0].GetName())
	require.Equal(t, 7.0, attrs[0].GetNumberValue())
	require.Equal(t, "full", attrs[1].GetStringValue())
}
