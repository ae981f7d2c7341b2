package definition

import (
	"fmt"
	"sort"
	"strings"

	"github.com/razorbill/flo/services/workflow/internal/mapping"
)

// validate runs the checks that need the whole definition: where transitions
// go, which steps mappings and cache keys read, which plans steps run, name
// clashes and reachability.
func validate(def *Definition, p *parser) {
	for _, name := range sortedKeys(def.Terminals) {
		if s, ok := def.Steps[name]; ok {
			t := def.Terminals[name]
			p.add(Error, CodeStepTerminalClash, s.Pos, "steps."+name, "%q names both a step and a terminal (at %s); rename one", name, t.Pos)
		}
	}
	steps := allSteps(def)
	used := map[string]bool{}
	for _, s := range steps {
		path := stepPath(s.Name)
		if s.Run != nil && s.Run.Kind == TargetPlan {
			used[s.Run.Name] = true
			if _, ok := def.Plan(s.Run.Name); !ok && !p.brokenPlans[s.Run.Name] && !p.plansUnread {
				p.add(Error, CodeUnknownPlan, s.runPos, path+".run", "%s names no plan of this workflow%s", s.Run, suggest(s.Run.Name, sortedKeys(def.Plans)))
			}
		}
		for _, outcome := range sortedKeys(s.Transitions) {
			checkDestination(def, p, s.Transitions[outcome], s.transitionPos[outcome], path+".transitions."+outcome, "the "+outcome+" transition")
		}
		if s.Wait != nil && s.Wait.OnTimeout != "" {
			checkDestination(def, p, s.Wait.OnTimeout, s.Wait.onTimeoutPos, path+".waitForSignal.onTimeout", "onTimeout")
		}
		if s.InputMapping != nil {
			for _, mp := range s.InputMapping.Paths() {
				checkMappingStep(def, p, mp, s.inputMappingPos, path+".inputMapping")
			}
		}
	}
	for _, name := range sortedKeys(def.Plans) {
		pl := def.Plans[name]
		if !used[name] {
			p.add(Warning, CodeUnusedPlan, pl.Pos, "plans."+name, "no step runs plan %s (@plan/%s)", name, name)
		}
		if pl.Cache == nil || pl.Cache.Key == nil {
			continue
		}
		for _, mp := range pl.Cache.Key.paths() {
			checkMappingStep(def, p, mp, pl.Cache.keyPos, "plans."+name+".cache.key")
		}
	}
	if def.Start == nil {
		return
	}
	reached := reachable(def)
	for _, name := range def.StepOrder {
		if !reached[name] {
			p.add(Warning, CodeUnreachable, def.Steps[name].Pos, "steps."+name, "step %s is not reachable from start: no transition leads to it", name)
		}
	}
}

// checkMappingStep reports a path that reads a step the workflow does not
// have.
func checkMappingStep(def *Definition, p *parser, mp *mapping.Path, at Position, path string) {
	if mp.Step() == "" {
		return
	}
	if _, ok := def.Step(mp.Step()); !ok {
		p.add(Error, CodeMappingStep, at, path, "path %q reads step %q, which the workflow does not have%s", mp, mp.Step(), suggest(mp.Step(), stepNames(def)))
	}
}

// checkDestination reports a transition target that is neither a step nor a
// terminal.
func checkDestination(def *Definition, p *parser, target string, at Position, path, what string) {
	if _, ok := def.Step(target); ok || p.broken[target] {
		return
	}
	if _, ok := def.Terminal(target); ok {
		return
	}
	known := stepNames(def)
	known = append(known, sortedKeys(def.Terminals)...)
	for t := range BuiltInTerminals {
		known = append(known, t)
	}
	sort.Strings(known)
	p.add(Error, CodeTransitionTarget, at, path, "%s goes to %q, which is not a step, a custom terminal or a built-in terminal (flo.Completed, flo.Failed, flo.Cancelled, flo.TimedOut)%s", what, clip(target), suggestTarget(target, known))
}

// suggestTarget is suggest for transition targets, where a case slip like
// flo.completed is the usual mistake.
func suggestTarget(target string, known []string) string {
	for _, k := range known {
		if strings.EqualFold(k, target) {
			return fmt.Sprintf(" (did you mean %s?)", k)
		}
	}
	return suggest(target, known)
}

// reachable walks the graph from the start step.
func reachable(def *Definition) map[string]bool {
	seen := map[string]bool{StartStep: true}
	queue := []*Step{def.Start}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		next := make([]string, 0, len(s.Transitions)+1)
		for _, t := range s.Transitions {
			next = append(next, t)
		}
		if s.Wait != nil && s.Wait.OnTimeout != "" {
			next = append(next, s.Wait.OnTimeout)
		}
		for _, t := range next {
			if seen[t] {
				continue
			}
			if n, ok := def.Step(t); ok {
				seen[t] = true
				queue = append(queue, n)
			}
		}
	}
	return seen
}

// allSteps returns the start step and the named steps in written order.
func allSteps(def *Definition) []*Step {
	var out []*Step
	if def.Start != nil {
		out = append(out, def.Start)
	}
	for _, name := range def.StepOrder {
		out = append(out, def.Steps[name])
	}
	return out
}

func stepNames(def *Definition) []string {
	names := append([]string{StartStep}, def.StepOrder...)
	return names
}

func stepPath(name string) string {
	if name == StartStep {
		return "start"
	}
	return "steps." + name
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
