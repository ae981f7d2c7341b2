package engine

import (
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

const fuzzMixed = `
kind: Workflow
name: mixed
version: "1"
terminals:
  Done: {status: completed}
  Gone: {status: cancelled}
start:
  run: "@actions/a"
  inputMapping: '{"v": "$.input.v", "prev": "$.steps.wait.output"}'
  retry: {max_attempts: 3, backoff: exponential_jitter, initial_delay_ms: 5, within_ms: 50}
  poll: {maxAttempts: 2, initialDelayMs: 3, backoff: linear, baseDelayMs: 2}
  transitions:
    success: wait
    failure: child
    timeout: Gone
    named: _start
steps:
  wait:
    waitForSignal: {type: go, timeoutMs: 20, onTimeout: _start}
    transitions:
      success: child
  child:
    run: "@workflow/sub:1"
    inputMapping: '{"at": "$.flo.timestamp", "run": "$.flo.run_id", "o": "$.steps._start.outcome"}'
    transitions:
      success: Done
      execution_failure: wait
      failure: flo.Failed
`

// FuzzAdvance drives runs of several workflows with arbitrary event
// sequences, fresh and stale, and checks that the engine never panics, that
// every advance keeps the invariants of checkAdvance, and that an ended run
// never moves again. The seed corpus runs in plain go test.
func FuzzAdvance(f *testing.F) {
	sources := []string{processOrder, orderProcessing, pollFlow, childFlow, signalFlow, fuzzMixed, planFlow, asyncPlanFlow, cachedPlanFlow}
	defs := make([]*definition.Definition, len(sources))
	for i, src := range sources {
		defs[i] = mustParse(f, src)
	}
	f.Add([]byte{0, 0, 1, 1, 1, 1, 1, 1})
	f.Add([]byte{1, 0, 1, 1, 2, 1, 3, 2, 1, 4, 5, 6, 7})
	f.Add([]byte{1, 3, 2, 0, 1, 1, 1, 1, 1, 9, 1, 9, 4})
	f.Add([]byte{2, 0, 1, 1, 0, 1, 4, 3, 1, 4, 3, 1, 4, 3, 1, 4})
	f.Add([]byte{3, 0, 5, 1, 5, 0, 1, 2, 5, 2})
	f.Add([]byte{4, 3, 2, 3, 2, 0, 3, 3, 3, 4, 4, 6})
	f.Add([]byte{5, 0, 1, 0, 3, 1, 3, 4, 1, 5, 5, 4, 7, 1, 1, 8, 1, 2})
	f.Add([]byte{5, 0, 1, 4, 1, 8, 3, 2, 3, 1, 1, 9, 4, 4, 4, 4, 6, 0})
	f.Add([]byte{5, 3, 2, 0, 1, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1, 7})
	f.Add([]byte{6, 0, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1})
	f.Add([]byte{6, 0, 7, 1, 1, 1, 1, 2, 1, 5, 3, 1, 1, 4, 7, 9, 1, 1})
	f.Add([]byte{7, 0, 4, 1, 3, 1, 1, 1, 1, 3, 1, 2, 1, 1, 1, 1})
	f.Add([]byte{8, 0, 11, 1, 1, 1, 1, 1, 0, 22, 1, 1, 1, 1})

	f.Fuzz(func(t *testing.T, data []byte) { runFuzzAdvance(t, defs, data) })
}

var (
	fuzzOutcomes = []string{"success", "failure", "pending", "timeout", "target_not_found", "target_disabled", "named", ""}
	fuzzOutputs  = []json.RawMessage{nil, json.RawMessage(`{}`), json.RawMessage(`{"v": 1, "paid": true}`), json.RawMessage(`{`), json.RawMessage(`[1,2]`)}
	fuzzStatuses = []Status{StatusCompleted, StatusFailed, StatusCancelled, StatusTimedOut, "", "bogus"}
	fuzzTypes    = []string{"go", "approval", "other"}
)

// runFuzzAdvance plays one event sequence decoded from data.
func runFuzzAdvance(t testing.TB, defs []*definition.Definition, data []byte) {
	outcomes, outputs, statuses, types := fuzzOutcomes, fuzzOutputs, fuzzStatuses, fuzzTypes
	{
		if len(data) == 0 || len(data) > 512 {
			return
		}
		def := defs[int(data[0])%len(defs)]
		data = data[1:]
		now := t0
		run := &Run{ID: "run-f", Workflow: def.Name, Version: def.Version, Status: StatusPending, Input: json.RawMessage(`{"v": 2}`)}
		var (
			pending []Signal
			ids     int
			ended   bool
		)
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := int(data[0])
			data = data[1:]
			return b
		}
		for len(data) > 0 {
			op := next()
			token := run.Token
			if next()%5 == 0 {
				token = strconv.Itoa(next())
			}
			var ev any
			switch op % 10 {
			case 0:
				ev = Started{}
			case 1:
				ev = TaskEnded{Token: token, Outcome: outcomes[next()%len(outcomes)], Output: outputs[next()%len(outputs)], Error: "e", NonRetryable: next()%4 == 0}
			case 2:
				ids++
				sig := Signal{ID: "s" + strconv.Itoa(ids), Type: types[next()%len(types)], Payload: outputs[next()%len(outputs)], ReceivedAt: now}
				pending = append(pending, sig)
				ev = SignalArrived{Signal: sig}
			case 3:
				ev = TimerFired{Token: token}
			case 4:
				ev = ChildEnded{Token: token, Status: statuses[next()%len(statuses)], Output: outputs[next()%len(outputs)]}
			case 5:
				ev = Cancel{Reason: "fuzz"}
			case 6:
				now = now.Add(time.Duration(next()) * time.Millisecond)
				continue
			case 7:
				ev = &TaskEnded{Token: token, Outcome: "success"}
			default:
				ev = TimerFired{Token: run.Token}
			}
			draw := float64(next()) / 256
			env := Env{Now: now, Pending: append([]Signal(nil), pending...), Rand: func() float64 { return draw }, Plans: &fuzzGate{seed: op, now: now}}
			if op%3 == 0 {
				env.NewID = func() string { ids++; return "c" + strconv.Itoa(ids) }
			}
			before := cloneRun(*run)
			eff, err := advance(def, run, ev, env)
			if err != nil {
				t.Fatalf("advance %T: %v", ev, err)
			}
			if err := checkAdvance(before, run, eff); err != nil {
				t.Fatalf("advance %T: %v", ev, err)
			}
			if ended && !run.Status.Ended() {
				t.Fatalf("an ended run is %s again", run.Status)
			}
			ended = run.Status.Ended()
			for _, id := range eff.ConsumedSignals {
				for i, p := range pending {
					if p.ID == id {
						pending = append(pending[:i:i], pending[i+1:]...)
						break
					}
				}
			}
		}
	}
}

// fuzzGate answers plan steps from a seed: some executors skipped for their
// breaker or rate limit, some invocations served from the cache.
type fuzzGate struct {
	seed, calls int
	now         time.Time
}

func (g *fuzzGate) Order(_ PlanRef, p *definition.Plan) []string {
	order := p.ByPriority()
	if g.seed%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

func (g *fuzzGate) Admit(_ PlanRef, _ *definition.Plan, _ *definition.Executor, _ time.Time) Admission {
	g.calls++
	switch (g.seed + g.calls) % 7 {
	case 0:
		return Admission{Skip: SkipBreakerOpen}
	case 1:
		return Admission{Skip: SkipRateLimited, RetryAt: g.now.Add(time.Duration(g.seed) * time.Millisecond)}
	}
	return Admission{}
}

func (g *fuzzGate) Cached(PlanRef, string, time.Time) (json.RawMessage, bool) {
	if g.seed%11 == 0 {
		return json.RawMessage(`{"cached": true}`), true
	}
	return nil, false
}
