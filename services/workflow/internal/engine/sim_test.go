package engine

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// t0 is when every simulated run starts.
var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// mustParse parses a definition that the test expects to be valid.
func mustParse(t testing.TB, src string) *definition.Definition {
	t.Helper()
	def, diags, err := definition.Parse([]byte(src))
	require.NoError(t, err, "diagnostics: %v", diags)
	return def
}

// sim plays the store around the engine: it keeps the run, applies effects
// the way the runtime does (timers replaced or cleared, consumed signals
// dropped, history appended) and checks the engine's invariants after
// every advance.
type sim struct {
	t        testing.TB
	gate     PlanGate
	def      *definition.Definition
	run      *Run
	now      time.Time
	pending  []Signal
	timers   []Timer
	history  []HistoryEvent
	invokes  []Invoke
	children []ChildStart
	rand     func() float64
	signals  int
	childIDs int
}

func newSim(t testing.TB, src, input string) *sim {
	t.Helper()
	def := mustParse(t, src)
	return &sim{
		t:   t,
		def: def,
		now: t0,
		run: &Run{ID: "run-1", Namespace: "default", Workflow: def.Name, Version: def.Version, Status: StatusPending, Input: json.RawMessage(input)},
	}
}

func (s *sim) env() Env {
	return Env{
		Now:     s.now,
		Rand:    s.rand,
		Pending: append([]Signal(nil), s.pending...),
		Plans:   s.gate,
		NewID: func() string {
			s.childIDs++
			return "child-" + strconv.Itoa(s.childIDs)
		},
	}
}

// do advances the run with ev and applies the effects.
func (s *sim) do(ev any) Effects {
	s.t.Helper()
	before := cloneRun(*s.run)
	eff, err := advance(s.def, s.run, ev, s.env())
	require.NoError(s.t, err)
	require.NoError(s.t, checkAdvance(before, s.run, eff))
	s.apply(eff)
	return eff
}

func (s *sim) apply(eff Effects) {
	switch {
	case len(eff.Timers) > 0:
		s.timers = append([]Timer(nil), eff.Timers...)
	case eff.ClearTimers:
		s.timers = nil
	}
	for _, id := range eff.ConsumedSignals {
		for i, p := range s.pending {
			if p.ID == id {
				s.pending = append(s.pending[:i:i], s.pending[i+1:]...)
				break
			}
		}
	}
	s.history = append(s.history, eff.History...)
	s.invokes = append(s.invokes, eff.Invokes...)
	s.children = append(s.children, eff.Children...)
}

func (s *sim) start() Effects { s.t.Helper(); return s.do(Started{}) }

// end reports the end of the task or child the run waits for.
func (s *sim) end(outcome, output string) Effects {
	s.t.Helper()
	return s.do(TaskEnded{Token: s.run.Token, Outcome: outcome, Output: raw(output)})
}

func (s *sim) fail(msg string) Effects {
	s.t.Helper()
	return s.do(TaskEnded{Token: s.run.Token, Outcome: "failure", Error: msg})
}

// signal stores a signal and delivers it, as the runtime's SignalRun does.
func (s *sim) signal(typ, payload string) Effects {
	s.t.Helper()
	s.signals++
	sig := Signal{ID: "sig-" + strconv.Itoa(s.signals), Type: typ, Payload: raw(payload), ReceivedAt: s.now}
	s.pending = append(s.pending, sig)
	return s.do(SignalArrived{Signal: sig})
}

// fire moves the clock to the run's timer and fires it.
func (s *sim) fire() Effects {
	s.t.Helper()
	require.Len(s.t, s.timers, 1, "the run should have one timer")
	tm := s.timers[0]
	s.timers = nil
	if tm.At.After(s.now) {
		s.now = tm.At
	}
	return s.do(TimerFired{Token: tm.Token})
}

// timerIn is how far in the future the run's single timer is.
func (s *sim) timerIn() time.Duration {
	s.t.Helper()
	require.Len(s.t, s.timers, 1, "the run should have one timer")
	return s.timers[0].At.Sub(s.now)
}

func (s *sim) lastInvoke() Invoke {
	s.t.Helper()
	require.NotEmpty(s.t, s.invokes)
	return s.invokes[len(s.invokes)-1]
}

func (s *sim) types() []string { return historyTypes(s.history) }

func historyTypes(hs []HistoryEvent) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Type
	}
	return out
}

func raw(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

func cloneRun(r Run) Run {
	r.Outputs = maps.Clone(r.Outputs)
	return r
}

// checkAdvance holds the invariants of every advance; the fuzz target uses
// it too.
func checkAdvance(before Run, run *Run, eff Effects) error {
	zero := reflect.DeepEqual(eff, Effects{})
	if zero && !reflect.DeepEqual(before, *run) {
		return fmt.Errorf("an ignored event changed the run: %+v -> %+v", before, *run)
	}
	if before.Status.Ended() && !zero {
		return fmt.Errorf("an event moved an ended run: %+v", eff)
	}
	if eff.Ended != (run.Status.Ended() && !before.Status.Ended()) {
		return fmt.Errorf("Effects.Ended %v but status %s -> %s", eff.Ended, before.Status, run.Status)
	}
	if before.Status.Ended() {
		return nil
	}
	if run.Status.Ended() {
		if run.Wait != WaitNone || run.Terminal == "" || run.FinishedAt.IsZero() || run.WaitingFor != "" || !run.Deadline.IsZero() {
			return fmt.Errorf("ended run still waits or lacks its terminal: %+v", *run)
		}
		if len(eff.Invokes)+len(eff.Children)+len(eff.Timers) > 0 {
			return fmt.Errorf("an advance that ended the run set up work: %+v", eff)
		}
		if run.Plan != nil {
			return fmt.Errorf("ended run still inside a plan: %+v", *run.Plan)
		}
		if run.Status == StatusFailed && run.Error == "" {
			return fmt.Errorf("failed run without an error: %+v", *run)
		}
	}
	switch run.Wait {
	case WaitTask:
		// Waiting when the task's result is pending (TaskWaiting).
		if run.Status != StatusRunning && run.Status != StatusWaiting {
			return fmt.Errorf("wait %s with status %s", run.Wait, run.Status)
		}
	case WaitChild:
		if run.Status != StatusRunning {
			return fmt.Errorf("wait %s with status %s", run.Wait, run.Status)
		}
	case WaitSignal, WaitRetry, WaitPoll, WaitPlan:
		if run.Status != StatusWaiting {
			return fmt.Errorf("wait %s with status %s", run.Wait, run.Status)
		}
	case WaitNone:
		if run.Status != StatusPending && !run.Status.Ended() {
			return fmt.Errorf("run neither waits nor has ended: status %s", run.Status)
		}
	default:
		return fmt.Errorf("unknown wait %q", run.Wait)
	}
	if run.Wait != WaitNone && run.Token == "" {
		return fmt.Errorf("wait %s without a token", run.Wait)
	}
	if run.Wait == WaitSignal && run.WaitingFor == "" {
		return fmt.Errorf("signal wait without a type")
	}
	if n := len(eff.Invokes) + len(eff.Children); n > 1 {
		return fmt.Errorf("%d invocations in one advance", n)
	}
	for _, in := range eff.Invokes {
		if run.Wait != WaitTask || in.Origin != Origin(run.ID, run.Token) || in.TaskID != TaskID(run.ID, run.Step, run.Token) {
			return fmt.Errorf("invoke %+v does not match the wait %s/%s", in, run.Wait, run.Token)
		}
	}
	for _, c := range eff.Children {
		if run.Wait != WaitChild || c.ParentToken != run.Token {
			return fmt.Errorf("child %+v does not match the wait %s/%s", c, run.Wait, run.Token)
		}
	}
	for _, tm := range eff.Timers {
		if tm.Token != run.Token || tm.Kind != run.Wait || tm.At.Before(run.UpdatedAt) {
			return fmt.Errorf("timer %+v does not match the wait %s/%s", tm, run.Wait, run.Token)
		}
	}
	if (run.Wait == WaitRetry || run.Wait == WaitPoll || run.Wait == WaitPlan) && run.Token != before.Token && len(eff.Timers) != 1 {
		return fmt.Errorf("new %s wait without its timer", run.Wait)
	}
	if eff.ClearTimers && run.Wait == before.Wait && run.Token == before.Token {
		return fmt.Errorf("timers cleared while the run still waits for the same thing")
	}
	if len(eff.Timers) > 0 && eff.ClearTimers {
		return fmt.Errorf("timers set and cleared at once")
	}
	for _, h := range eff.History {
		if h.Type == "" {
			return fmt.Errorf("history event without a type")
		}
	}
	return nil
}
