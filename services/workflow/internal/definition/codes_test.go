package definition_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/razorbill/flo/services/workflow/internal/definition"
)

// codeCase is a malformed (or, for warnings, questionable) definition and
// the diagnostic it must produce.
type codeCase struct {
	name string
	code definition.Code
	src  string
	// pos is where the diagnostic must point, LINE:COL.
	pos string
	// contains is a phrase the message must hold.
	contains string
	// path, when set, is the path the diagnostic must name.
	path string
}

// codeCases holds at least one case per code; TestEveryCodeHasACase keeps it
// that way.
var codeCases = []codeCase{
	{
		name: "yaml syntax", code: definition.CodeSyntax, pos: "3",
		src:      "kind: Workflow\nname: x\nversion: a: b\n",
		contains: "invalid YAML: mapping values are not allowed in this context",
	},
	{name: "empty document", code: definition.CodeDocument, pos: "1:1", src: "", contains: "empty"},
	{name: "comment-only document", code: definition.CodeDocument, pos: "1:1", src: "# nothing\n", contains: "empty"},
	{name: "list document", code: definition.CodeDocument, pos: "1:1", src: "- kind: Workflow\n", contains: "not a list"},
	{
		name: "two documents", code: definition.CodeDocument, pos: "5:1",
		src: `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
---
kind: Workflow
`,
		contains: "more than one YAML document",
	},
	{name: "too large", code: definition.CodeDocument, pos: "1:1", src: "# " + strings.Repeat("x", definition.MaxSourceBytes), contains: "the limit is"},
	{
		name: "missing version", code: definition.CodeMissingField, pos: "1:1",
		src: `kind: Workflow
name: x
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: "needs a version field",
	},
	{
		name: "empty name", code: definition.CodeMissingField, pos: "2:6",
		src: `kind: Workflow
name:
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: "name must not be empty",
	},
	{
		name: "missing start", code: definition.CodeMissingField, pos: "1:1",
		src: `kind: Workflow
name: x
version: "1"
`,
		contains: "needs a start field",
	},
	{
		name: "wrong kind", code: definition.CodeKind, pos: "1:7",
		src: `kind: Workflw
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: `kind must be Workflow, not "Workflw"`,
	},
	{
		name: "unknown step field", code: definition.CodeUnknownField, pos: "6:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retries: {max_attempts: 3}
  transitions: {success: flo.Completed}
`,
		contains: `unknown field "retries" in a step (did you mean retry?); known fields: run, waitForSignal, inputMapping, retry, poll, transitions`,
	},
	{
		name: "unknown poll field in other casing", code: definition.CodeUnknownField, pos: "7:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  poll:
    max_attempts: 3
  transitions: {success: flo.Completed, timeout: flo.TimedOut}
`,
		contains: "did you mean maxAttempts?",
	},
	{
		name: "unknown top-level field", code: definition.CodeUnknownField, pos: "4:1",
		src: `kind: Workflow
name: x
version: "1"
descripton: typo
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: `unknown field "descripton"`,
	},
	{
		name: "start is a string", code: definition.CodeType, pos: "4:8",
		src: `kind: Workflow
name: x
version: "1"
start: "@actions/a"
`,
		contains: "a step must be a mapping",
	},
	{
		name: "timeout is a fraction", code: definition.CodeType, pos: "11:18",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal:
      type: approval
      timeoutMs: 1.5
    transitions: {success: flo.Completed}
`,
		contains: "timeoutMs must be a whole number",
	},
	{
		name: "bad workflow name", code: definition.CodeName, pos: "2:7",
		src: `kind: Workflow
name: "process order"
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: `workflow name "process order" is invalid`,
	},
	{
		name: "bad version", code: definition.CodeName, pos: "3:10",
		src: `kind: Workflow
name: x
version: "1.0 beta"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: `version "1.0 beta" is invalid`,
	},
	{
		name: "bad idempotency", code: definition.CodeIdempotency, pos: "4:14",
		src: `kind: Workflow
name: x
version: "1"
idempotency: always
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: "idempotency must be none, optional or required",
	},
	{
		name: "step with run and waitForSignal", code: definition.CodeStepKind, pos: "6:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  waitForSignal: {type: approval, timeoutMs: 1000}
  transitions: {success: flo.Completed}
`,
		contains: "remove run or waitForSignal",
	},
	{
		name: "step with neither", code: definition.CodeStepKind, pos: "5:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  transitions: {success: flo.Completed}
`,
		contains: "needs run (a target) or waitForSignal",
	},
	{
		name: "run step without transitions", code: definition.CodeNoTransitions, pos: "5:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
`,
		contains: "needs transitions",
	},
	{
		name: "signal step without success", code: definition.CodeNoTransitions, pos: "9:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal: {type: approval, timeoutMs: 1000, onTimeout: flo.Failed}
`,
		contains: "needs a success transition",
	},
	{
		name: "reserved step name", code: definition.CodeStepName, pos: "8:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: flo.Completed}
steps:
  _start:
    run: "@actions/b"
    transitions: {success: flo.Completed}
`,
		contains: "reserved for the start step",
	},
	{
		name: "step name with a dot", code: definition.CodeStepName, pos: "8:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: flo.Completed}
steps:
  charge.card:
    run: "@actions/b"
    transitions: {success: flo.Completed}
`,
		contains: `step name "charge.card" is invalid`,
	},
	{
		name: "terminal with bad status", code: definition.CodeTerminal, pos: "6:13",
		src: `kind: Workflow
name: x
version: "1"
terminals:
  Done:
    status: succeeded
start: {run: "@actions/a", transitions: {success: Done}}
`,
		contains: "status must be completed, failed, cancelled or timed_out",
	},
	{
		name: "terminal with reserved name", code: definition.CodeTerminal, pos: "5:3",
		src: `kind: Workflow
name: x
version: "1"
terminals:
  flo.Done:
    status: completed
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: "is reserved",
	},
	{
		name: "terminal without status", code: definition.CodeTerminal, pos: "5:3",
		src: `kind: Workflow
name: x
version: "1"
terminals:
  Done: {}
start: {run: "@actions/a", transitions: {success: Done}}
`,
		contains: "needs a status",
	},
	{
		name: "retry on a signal step", code: definition.CodeRunOnly, pos: "10:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal: {type: approval, timeoutMs: 1000}
    retry: {max_attempts: 3}
    transitions: {success: flo.Completed}
`,
		contains: "retry applies to run steps only",
	},
	{
		name: "input mapping not JSON", code: definition.CodeInputMapping, pos: "6:17",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  inputMapping: '{amount: "$.input.amount"}'
  transitions: {success: flo.Completed}
`,
		contains: "inputMapping is not valid JSON",
	},
	{
		name: "merge key", code: definition.CodeMergeKey, pos: "8:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: flo.Completed}
  retry:
    <<: {max_attempts: 2}
`,
		contains: "merge keys (<<) are not supported",
	},
	{
		name: "too many transitions", code: definition.CodeLimit, pos: "6:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions:
` + manyTransitions(definition.MaxTransitions+1),
		contains: "the limit is 64",
	},
	{
		name: "schedule with cron and interval", code: definition.CodeScheduleKind, pos: "6:3", path: "schedule.interval",
		src: scheduled("  cron: \"*/5 * * * *\"\n  interval: 1000\n"), contains: "cron or interval, not both",
	},
	{
		name: "schedule with neither", code: definition.CodeScheduleKind, pos: "4:1",
		src: scheduled("  max_concurrent: 2\n"), contains: "needs cron",
	},
	{
		name: "bad cron", code: definition.CodeCron, pos: "5:9", path: "schedule.cron",
		src: scheduled("  cron: \"61 * * * *\"\n"), contains: "not a 5-field expression",
	},
	{
		name: "cron that never fires", code: definition.CodeCron, pos: "5:9",
		src: scheduled("  cron: \"0 0 30 2 *\"\n"), contains: "matches no date",
	},
	{
		name: "cron with six fields", code: definition.CodeCron, pos: "5:9",
		src: scheduled("  cron: \"0 0 */6 * * *\"\n"), contains: "found 6",
	},
	{
		name: "cron with a time zone prefix", code: definition.CodeCron, pos: "5:9",
		src: scheduled("  cron: \"CRON_TZ=Europe/Paris 0 9 * * *\"\n"), contains: "timezone field",
	},
	{
		name: "zero interval", code: definition.CodeInterval, pos: "5:13", path: "schedule.interval",
		src: scheduled("  interval: 0\n"), contains: "between 1 and",
	},
	{
		name: "negative interval", code: definition.CodeInterval, pos: "5:13",
		src: scheduled("  interval: -5\n"), contains: "not -5",
	},
	{
		name: "zero max_concurrent", code: definition.CodeMaxConcurrent, pos: "6:19", path: "schedule.max_concurrent",
		src: scheduled("  interval: 1000\n  max_concurrent: 0\n"), contains: "between 1 and 1000",
	},
	{
		name: "schedule input not JSON", code: definition.CodeScheduleInput, pos: "6:10", path: "schedule.input",
		src: scheduled("  interval: 1000\n  input: '{mode: full}'\n"), contains: "input is not JSON",
	},
	{
		name: "unknown time zone", code: definition.CodeTimezone, pos: "6:13", path: "schedule.timezone",
		src: scheduled("  cron: \"0 9 * * *\"\n  timezone: Mars/Olympus\n"), contains: "not an IANA time zone",
	},
	{
		name: "time zone on an interval", code: definition.CodeTimezone, pos: "6:3",
		src: scheduled("  interval: 1000\n  timezone: UTC\n"), contains: "cron schedules only",
	},
	{
		name: "unknown schedule field", code: definition.CodeUnknownField, pos: "6:3", path: "schedule.max_concurrency",
		src: scheduled("  interval: 1000\n  max_concurrency: 2\n"), contains: "did you mean max_concurrent?",
	},
	{
		name: "paused not a boolean", code: definition.CodeType, pos: "6:11",
		src: scheduled("  interval: 1000\n  paused: sometimes\n"), contains: "must be true or false",
	},
	{
		name: "attribute without a name", code: definition.CodeAttributeName, pos: "6:5", path: "searchAttributes[0]",
		src: searched("  - {type: string, from: input.a}\n"), contains: "needs a name",
	},
	{
		name: "attribute name starting with a digit", code: definition.CodeAttributeName, pos: "6:11", path: "searchAttributes[0].name",
		src: searched("  - name: 1st\n    type: string\n    from: input.a\n"), contains: "starting with a letter",
	},
	{
		name: "attribute name with a space", code: definition.CodeAttributeName, pos: "6:11",
		src: searched("  - name: customer id\n    type: string\n    from: input.a\n"), contains: "is invalid",
	},
	{
		name: "unknown attribute type", code: definition.CodeAttributeType, pos: "7:11", path: "searchAttributes[0].type",
		src: searched("  - name: a\n    type: strng\n    from: input.a\n"), contains: "did you mean string?",
	},
	{
		name: "attribute without a type", code: definition.CodeAttributeType, pos: "6:5",
		src: searched("  - {name: a, from: input.a}\n"), contains: "needs a type",
	},
	{
		name: "attribute path outside the input", code: definition.CodeAttributeFrom, pos: "8:11", path: "searchAttributes[0].from",
		src: searched("  - name: a\n    type: string\n    from: steps.s.output.id\n"), contains: "must be a path into the input",
	},
	{
		name: "attribute path selecting several values", code: definition.CodeAttributeFrom, pos: "8:11",
		src: searched("  - name: a\n    type: string\n    from: input.items[*].sku\n"), contains: "can select several values",
	},
	{
		name: "malformed attribute path", code: definition.CodeAttributeFrom, pos: "8:11",
		src: searched("  - name: a\n    type: string\n    from: customer.id\n"), contains: "is not a path into the input",
	},
	{
		name: "attribute without from", code: definition.CodeAttributeFrom, pos: "6:5",
		src: searched("  - {name: a, type: number}\n"), contains: "needs from",
	},
	{
		name: "duplicate attribute", code: definition.CodeDuplicateAttribute, pos: "7:11", path: "searchAttributes[1].name",
		src: searched("  - {name: a, type: string, from: input.a}\n  - name: a\n    type: number\n    from: input.b\n"), contains: "written twice (first at 6:12)",
	},
	{
		name: "attribute named like a built-in field", code: definition.CodeAttributeReserved, pos: "6:11",
		src: searched("  - name: Status\n    type: string\n    from: input.status\n"), contains: "is reserved",
	},
	{
		name: "attribute named like a keyword", code: definition.CodeAttributeReserved, pos: "6:11",
		src: searched("  - name: in\n    type: string\n    from: input.a\n"), contains: "keywords",
	},
	{
		name: "schedule input of the wrong type", code: definition.CodeScheduleAttribute, pos: "5:1", path: "searchAttributes",
		src: `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
searchAttributes: [{name: mode, type: number, from: input.mode}]
schedule: {interval: 1000, input: '{"mode": "full"}'}
`,
		contains: `the schedule's input does not fit: search attribute mode (number, from $.input.mode): the string "full" is not a number`,
	},
	{
		name: "too many attributes", code: definition.CodeLimit, pos: "5:1", path: "searchAttributes",
		src: searched(manyAttributes(definition.MaxSearchAttributes + 1)), contains: "33 search attributes; the limit is 32",
	},
	{
		name: "searchAttributes not a list", code: definition.CodeType, pos: "5:19",
		src: strings.TrimSuffix(searched(""), "\n") + " {a: b}\n", contains: "must be a list",
	},
	{
		name: "trigger without a stream", code: definition.CodeTriggerStream, pos: "4:1", path: "trigger",
		src: triggered("  mode: shared\n"), contains: "needs a stream",
	},
	{
		name: "trigger stream malformed", code: definition.CodeTriggerStream, pos: "5:11", path: "trigger.stream",
		src: triggered("  stream: a/b\n"), contains: "is invalid",
	},
	{
		name: "trigger namespace malformed", code: definition.CodeTriggerNamespace, pos: "6:14", path: "trigger.namespace",
		src: triggered("  stream: orders\n  namespace: _prod\n"), contains: "starting with a letter or digit",
	},
	{
		name: "trigger consumer_group malformed", code: definition.CodeTriggerGroup, pos: "6:19", path: "trigger.consumer_group",
		src: triggered("  stream: orders\n  consumer_group: -g\n"), contains: "is invalid",
	},
	{
		name: "trigger default group too long", code: definition.CodeTriggerGroup, pos: "4:1", path: "trigger",
		src: strings.Replace(triggered("  stream: orders\n"), "name: x", "name: "+strings.Repeat("w", 126), 1), contains: "name one with consumer_group",
	},
	{
		name: "trigger mode unknown", code: definition.CodeTriggerMode, pos: "6:9", path: "trigger.mode",
		src: triggered("  stream: orders\n  mode: keyshared\n"), contains: "did you mean key_shared?",
	},
	{
		name: "trigger batch_size zero", code: definition.CodeTriggerBatch, pos: "6:15", path: "trigger.batch_size",
		src: triggered("  stream: orders\n  batch_size: 0\n"), contains: "between 1 and 1000, not 0",
	},
	{
		name: "trigger batch_size too large", code: definition.CodeTriggerBatch, pos: "6:15",
		src: triggered("  stream: orders\n  batch_size: 1001\n"), contains: "not 1001",
	},
	{
		name: "target without prefix", code: definition.CodeTarget, pos: "5:8",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: charge-payment
  transitions: {success: flo.Completed}
`,
		contains: "must be @actions/NAME, @workflow/NAME[:VERSION] or @plan/NAME",
	},
	{
		name: "target with unknown prefix", code: definition.CodeTarget, pos: "5:8",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@action/charge-payment"
  transitions: {success: flo.Completed}
`,
		contains: "unknown prefix @action/",
	},
	{
		name: "target with bad name", code: definition.CodeTargetName, pos: "5:8",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/charge payment"
  transitions: {success: flo.Completed}
`,
		contains: `name "charge payment" in "@actions/charge payment" is invalid`,
	},
	{
		name: "child workflow with empty version", code: definition.CodeTargetVersion, pos: "5:8",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@workflow/payment-flow:"
  transitions: {success: flo.Completed}
`,
		contains: `version "" in "@workflow/payment-flow:" is invalid`,
	},
	{
		name: "mapping path with unknown root", code: definition.CodeMappingPath, pos: "6:17",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  inputMapping: '{"amount": "$.inputs.amount"}'
  transitions: {success: flo.Completed}
`,
		contains: `path "$.inputs.amount"`,
	},
	{
		name: "mapping reads an unknown step", code: definition.CodeMappingStep, pos: "11:19",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: charge}
steps:
  enrich: {run: "@actions/e", transitions: {success: flo.Completed}}
  charge:
    run: "@actions/c"
    inputMapping: '{"email": "$.steps.enrichh.output.email"}'
    transitions: {success: enrich}
`,
		contains: `reads step "enrichh", which the workflow does not have (did you mean enrich?)`,
	},
	{
		name: "transition to unknown step", code: definition.CodeTransitionTarget, pos: "7:14",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions:
    success: shipp
steps:
  ship: {run: "@actions/s", transitions: {success: flo.Completed}}
`,
		contains: `goes to "shipp", which is not a step, a custom terminal or a built-in terminal`,
	},
	{
		name: "transition to miscased built-in", code: definition.CodeTransitionTarget, pos: "6:26",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: flo.completed}
`,
		contains: "did you mean flo.Completed?",
	},
	{
		name: "onTimeout to unknown terminal", code: definition.CodeTransitionTarget, pos: "9:65",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal: {type: approval, timeoutMs: 1000, onTimeout: Rejected}
    transitions: {success: flo.Completed}
`,
		contains: `onTimeout goes to "Rejected"`,
	},
	{
		name: "bad outcome name", code: definition.CodeOutcomeName, pos: "7:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions:
    "out of stock": flo.Failed
    success: flo.Completed
`,
		contains: `outcome "out of stock" is invalid`,
	},
	{
		name: "failure transition on signal step", code: definition.CodeSignalOutcome, pos: "12:7",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal: {type: approval, timeoutMs: 1000}
    transitions:
      success: flo.Completed
      timeout: flo.Failed
`,
		contains: "use waitForSignal.onTimeout",
	},
	{
		name: "unreachable step", code: definition.CodeUnreachable, pos: "8:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: flo.Completed}
steps:
  orphan:
    run: "@actions/b"
    transitions: {success: flo.Completed}
`,
		contains: "step orphan is not reachable from start",
	},
	{
		name: "duplicate step", code: definition.CodeDuplicateStep, pos: "11:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: ship}
steps:
  ship:
    run: "@actions/s"
    transitions: {success: flo.Completed}
  ship:
    run: "@actions/s2"
    transitions: {success: flo.Completed}
`,
		contains: `step "ship" is written twice (first at 8:3)`,
	},
	{
		name: "duplicate terminal", code: definition.CodeDuplicateTerminal, pos: "6:3",
		src: `kind: Workflow
name: x
version: "1"
terminals:
  Done: {status: completed}
  Done: {status: failed}
start: {run: "@actions/a", transitions: {success: Done}}
`,
		contains: `terminal "Done" is written twice`,
	},
	{
		name: "step and terminal share a name", code: definition.CodeStepTerminalClash, pos: "9:3",
		src: `kind: Workflow
name: x
version: "1"
terminals:
  ship: {status: completed}
start: {run: "@actions/a", transitions: {success: ship}}
steps:
  # The step named ship would shadow the terminal.
  ship: {run: "@actions/s", transitions: {success: flo.Completed}}
`,
		contains: `"ship" names both a step and a terminal (at 5:3)`,
	},
	{
		name: "duplicate outcome", code: definition.CodeDuplicateKey, pos: "8:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions:
    success: flo.Completed
    success: flo.Failed
`,
		contains: `outcome "success" is written twice`,
	},
	{
		name: "duplicate field", code: definition.CodeDuplicateKey, pos: "3:1",
		src: `kind: Workflow
name: x
name: y
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
`,
		contains: `field "name" is written twice`,
	},
	{
		name: "signal without type", code: definition.CodeSignalType, pos: "9:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal:
      timeoutMs: 1000
    transitions: {success: flo.Completed}
`,
		contains: "needs the type of signal",
	},
	{
		name: "signal type with spaces", code: definition.CodeSignalType, pos: "10:13",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal:
      type: manager approval
      timeoutMs: 1000
    transitions: {success: flo.Completed}
`,
		contains: `signal type "manager approval" is invalid`,
	},
	{
		name: "zero signal timeout", code: definition.CodeSignalTimeout, pos: "9:48",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal: {type: approval, timeoutMs: 0}
    transitions: {success: flo.Completed}
`,
		contains: "timeoutMs must be between 1 and 31536000000 milliseconds, not 0",
	},
	{
		name: "onTimeout without timeout", code: definition.CodeOnTimeoutNoTimeout, pos: "9:37",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal: {type: approval, onTimeout: flo.Failed}
    transitions: {success: flo.Completed}
`,
		contains: "onTimeout never fires without timeoutMs",
	},
	{
		name: "unknown retry backoff", code: definition.CodeBackoff, pos: "8:14",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry:
    max_attempts: 3
    backoff: exponental
  transitions: {success: flo.Completed}
`,
		contains: `backoff "exponental" is not one of constant, linear, exponential, exponential_jitter (did you mean exponential?)`,
	},
	{
		name: "unknown poll backoff", code: definition.CodeBackoff, pos: "6:35",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  poll: {maxAttempts: 3, backoff: fibonacci}
  transitions: {success: flo.Completed, timeout: flo.TimedOut}
`,
		contains: `backoff "fibonacci"`,
	},
	{
		name: "zero retry attempts", code: definition.CodeMaxAttempts, pos: "7:19",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry:
    max_attempts: 0
  transitions: {success: flo.Completed}
`,
		contains: "max_attempts counts every attempt, the first included: it must be between 1 and 1000, not 0",
	},
	{
		name: "too many polls", code: definition.CodeMaxAttempts, pos: "6:23",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  poll: {maxAttempts: 100000}
  transitions: {success: flo.Completed, timeout: flo.TimedOut}
`,
		contains: "maxAttempts must be between 1 and 10000",
	},
	{
		name: "max delay below initial", code: definition.CodeDelay, pos: "8:19",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry:
    initial_delay_ms: 5000
    max_delay_ms: 1000
  transitions: {success: flo.Completed}
`,
		contains: "max_delay_ms 1000 is less than initial_delay_ms 5000",
	},
	{
		name: "negative initial delay", code: definition.CodeDelay, pos: "7:23",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry:
    initial_delay_ms: -1
  transitions: {success: flo.Completed}
`,
		contains: "initial_delay_ms must be between 0 and 604800000 milliseconds, not -1",
	},
	{
		name: "zero within budget", code: definition.CodeDelay, pos: "7:16",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry:
    within_ms: 0
  transitions: {success: flo.Completed}
`,
		contains: "within_ms must be between 1 and",
	},
	{
		name: "poll max below base", code: definition.CodeDelay, pos: "6:41",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  poll: {baseDelayMs: 2000, maxDelayMs: 10}
  transitions: {success: flo.Completed, timeout: flo.TimedOut}
`,
		contains: "maxDelayMs 10 is less than baseDelayMs 2000",
	},
	{
		name: "multiplier below one", code: definition.CodeMultiplier, pos: "7:17",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  retry:
    multiplier: 0.5
  transitions: {success: flo.Completed}
`,
		contains: "multiplier must be between 1 and 100, not 0.5",
	},
	{
		name: "signal without timeout", code: definition.CodeNoSignalTimeout, pos: "9:5",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  transitions: {success: wait}
steps:
  wait:
    waitForSignal: {type: approval}
    transitions: {success: flo.Completed}
`,
		contains: `the run waits for a "approval" signal forever`,
	},
	{
		name: "poll without timeout transition", code: definition.CodePollWithoutTimeoutTo, pos: "6:3",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@actions/a"
  poll: {maxAttempts: 5}
  transitions: {success: flo.Completed, failure: flo.Failed}
`,
		contains: "when 5 polls still report pending the run fails",
	},
	{
		name: "unknown plan", code: definition.CodeUnknownPlan, pos: "5:8", path: "start.run",
		src: `kind: Workflow
name: x
version: "1"
start:
  run: "@plan/paymnt"
  transitions: {success: flo.Completed}
plans:
  payment:
    executors: [{name: a, action: "@actions/a"}]
`,
		contains: "@plan/paymnt names no plan of this workflow (did you mean payment?)",
	},
	{
		name: "cache key reads an unknown step", code: definition.CodeMappingStep, pos: "8:32", path: "plans.p.cache.key",
		src: planSrc(oneExecutor + `    cache: {ttl_ms: 1000, key: "k:{steps.nope.output.id}"}
`),
		contains: `reads step "nope", which the workflow does not have`,
	},
	{
		name: "too many plans", code: definition.CodeLimit, pos: "5:1", path: "plans",
		src: `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
plans:
` + manyPlans(definition.MaxPlans+1),
		contains: "101 plans; the limit is 100",
	},
	{
		name: "too many executors", code: definition.CodeLimit, pos: "7:5", path: "plans.p.executors",
		src:      planSrc("    executors:\n" + strings.Repeat("      - {name: a, action: \"@actions/a\"}\n", definition.MaxExecutors+1)),
		contains: "33 executors; the limit is 32",
	},
	{
		name: "unknown plan field", code: definition.CodeUnknownField, pos: "7:5", path: "plans.p.selecton",
		src:      planSrc("    selecton: random\n" + oneExecutor),
		contains: `unknown field "selecton" in a plan (did you mean selection?)`,
	},
	{
		name: "unknown executor field", code: definition.CodeUnknownField, pos: "10:9", path: "plans.p.executors[0].rate_limits",
		src: planSrc(`    executors:
      - name: a
        action: "@actions/a"
        rate_limits: {max_per_second: 5}
`),
		contains: `unknown field "rate_limits" in an executor (did you mean rate_limit?)`,
	},
	{
		name: "duplicate executor", code: definition.CodeDuplicateExecutor, pos: "9:16", path: "plans.p.executors[1].name",
		src: planSrc(`    executors:
      - {name: a, action: "@actions/a"}
      - {name: a, action: "@actions/b"}
`),
		contains: `executor name "a" is written twice in this plan (first at 8:16)`,
	},
	{
		name: "duplicate plan", code: definition.CodeDuplicatePlan, pos: "8:3", path: "plans.p",
		src: planSrc(oneExecutor + `  p:
` + oneExecutor),
		contains: `plan "p" is written twice (first at 6:3)`,
	},
	{
		name: "plan name", code: definition.CodePlanName, pos: "6:3", path: "plans.-p",
		src: `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
plans:
  -p:
` + oneExecutor,
		contains: `plan name "-p" is invalid`,
	},
	{
		name: "plan without executors", code: definition.CodeNoExecutors, pos: "6:3", path: "plans.p",
		src:      planSrc("    selection: random\n"),
		contains: "plan p needs executors: at least one",
	},
	{
		name: "empty executors", code: definition.CodeNoExecutors, pos: "7:16", path: "plans.p.executors",
		src:      planSrc("    executors: []\n"),
		contains: "executors is empty",
	},
	{
		name: "executor name", code: definition.CodeExecutorName, pos: "7:24", path: "plans.p.executors[0].name",
		src:      planSrc("    executors: [{name: \"a b\", action: \"@actions/a\"}]\n"),
		contains: `executor name "a b" is invalid`,
	},
	{
		name: "executor without name", code: definition.CodeExecutorName, pos: "7:17", path: "plans.p.executors[0]",
		src:      planSrc("    executors: [{action: \"@actions/a\"}]\n"),
		contains: "an executor needs a name",
	},
	{
		name: "executor action not an action", code: definition.CodeExecutorAction, pos: "7:35", path: "plans.p.executors[0].action",
		src:      planSrc("    executors: [{name: a, action: \"@plan/q\"}]\n"),
		contains: `action "@plan/q" must be @actions/NAME`,
	},
	{
		name: "unknown selection", code: definition.CodeSelection, pos: "7:16", path: "plans.p.selection",
		src:      planSrc("    selection: health_weighted\n" + oneExecutor),
		contains: `selection "health_weighted" is not one of static-order, round-robin, random, health-weighted (did you mean health-weighted?)`,
	},
	{
		name: "health-weighted without health", code: definition.CodeHealthRequired, pos: "7:16", path: "plans.p.selection",
		src:      planSrc("    selection: health-weighted\n" + oneExecutor),
		contains: "health-weighted needs a health block",
	},
	{
		name: "health decay zero", code: definition.CodeHealthDecay, pos: "9:21", path: "plans.p.health.decay",
		src:      planSrc("    selection: health-weighted\n" + oneExecutor + "    health: {decay: 0}\n"),
		contains: "decay must be in (0, 1]",
	},
	{
		name: "health decay above one", code: definition.CodeHealthDecay, pos: "9:21", path: "plans.p.health.decay",
		src:      planSrc("    selection: health-weighted\n" + oneExecutor + "    health: {decay: 1.5}\n"),
		contains: "not 1.5",
	},
	{
		name: "health min samples", code: definition.CodeHealthMinSamples, pos: "9:27", path: "plans.p.health.min_samples",
		src:      planSrc("    selection: health-weighted\n" + oneExecutor + "    health: {min_samples: 0}\n"),
		contains: "min_samples must be between 1 and 10000, not 0",
	},
	{
		name: "health window", code: definition.CodeHealthWindow, pos: "9:25", path: "plans.p.health.window_ms",
		src:      planSrc("    selection: health-weighted\n" + oneExecutor + "    health: {window_ms: 0}\n"),
		contains: "window_ms must be between 1 and 604800000 milliseconds, not 0",
	},
	{
		name: "breaker cooldown", code: definition.CodeBreaker, pos: "11:54", path: "plans.p.executors[1].breaker.cooldown_ms",
		src: planSrc(`    executors:
      - {name: a, action: "@actions/a"}
      - name: b
        action: "@actions/b"
        breaker: {failure_threshold: 3, cooldown_ms: 0}
`),
		contains: "cooldown_ms must be between 1 and 604800000 milliseconds, not 0",
	},
	{
		name: "breaker threshold", code: definition.CodeBreaker, pos: "10:38", path: "plans.p.executors[0].breaker.failure_threshold",
		src: planSrc(`    executors:
      - name: a
        action: "@actions/a"
        breaker: {failure_threshold: 0}
`),
		contains: "failure_threshold must be between 1 and 10000, not 0",
	},
	{
		name: "breaker half-open calls", code: definition.CodeBreaker, pos: "10:40", path: "plans.p.executors[0].breaker.half_open_max_calls",
		src: planSrc(`    executors:
      - name: a
        action: "@actions/a"
        breaker: {half_open_max_calls: -1}
`),
		contains: "half_open_max_calls must be between 1 and 10000, not -1",
	},
	{
		name: "rate limit", code: definition.CodeRateLimit, pos: "10:58", path: "plans.p.executors[0].rate_limit.max_per_minute",
		src: planSrc(`    executors:
      - name: a
        action: "@actions/a"
        rate_limit: {max_per_second: 10, max_per_minute: 0}
`),
		contains: "max_per_minute must be between 1 and 1000000000, not 0",
	},
	{
		name: "tracking mode", code: definition.CodeTrackingMode, pos: "10:26", path: "plans.p.executors[0].tracking.mode",
		src: planSrc(`    executors:
      - name: a
        action: "@actions/a"
        tracking: {mode: webhook}
`),
		contains: `mode "webhook" is not sync or async`,
	},
	{
		name: "tracking timeout with sync", code: definition.CodeTrackingTimeout, pos: "10:32", path: "plans.p.executors[0].tracking.timeout_ms",
		src: planSrc(`    executors:
      - name: a
        action: "@actions/a"
        tracking: {mode: sync, timeout_ms: 1000}
`),
		contains: "timeout_ms applies to mode async only",
	},
	{
		name: "tracking timeout zero", code: definition.CodeTrackingTimeout, pos: "10:45", path: "plans.p.executors[0].tracking.timeout_ms",
		src: planSrc(`    executors:
      - name: a
        action: "@actions/a"
        tracking: {mode: async, timeout_ms: 0}
`),
		contains: "timeout_ms must be between 1 and 31536000000 milliseconds, not 0",
	},
	{
		name: "cache without key", code: definition.CodeCacheIncomplete, pos: "8:5", path: "plans.p.cache",
		src:      planSrc(oneExecutor + "    cache: {ttl_ms: 1000}\n"),
		contains: "cache needs a key template",
	},
	{
		name: "cache without ttl", code: definition.CodeCacheIncomplete, pos: "8:5", path: "plans.p.cache",
		src:      planSrc(oneExecutor + "    cache: {key: \"k:{input.id}\"}\n"),
		contains: "cache needs ttl_ms",
	},
	{
		name: "cache ttl", code: definition.CodeCacheTTL, pos: "8:21", path: "plans.p.cache.ttl_ms",
		src:      planSrc(oneExecutor + "    cache: {ttl_ms: 0, key: \"k:{input.id}\"}\n"),
		contains: "ttl_ms must be between 1 and 31536000000 milliseconds, not 0",
	},
	{
		name: "cache key unclosed", code: definition.CodeCacheKey, pos: "8:32", path: "plans.p.cache.key",
		src:      planSrc(oneExecutor + "    cache: {ttl_ms: 1000, key: \"k:{input.id\"}\n"),
		contains: "has a '{' that is never closed",
	},
	{
		name: "invalidate event", code: definition.CodeInvalidateEvent, pos: "8:69", path: "plans.p.cache.invalidate_on[1]",
		src:      planSrc(oneExecutor + "    cache: {ttl_ms: 1000, key: \"k:{input.id}\", invalidate_on: [a.b, \"c d\"]}\n"),
		contains: `event "c d" is invalid`,
	},
	{
		name: "fallback value", code: definition.CodeFallbackValue, pos: "8:23", path: "plans.p.fallback.value",
		src:      planSrc(oneExecutor + "    fallback: {value: declined}\n"),
		contains: "fallback value is not JSON",
	},
	{
		name: "fallback without value", code: definition.CodeFallbackValue, pos: "8:5", path: "plans.p.fallback",
		src:      planSrc(oneExecutor + "    fallback: {condition: exhausted}\n"),
		contains: "fallback needs a value",
	},
	{
		name: "fallback condition", code: definition.CodeFallbackCondition, pos: "8:40", path: "plans.p.fallback.condition",
		src:      planSrc(oneExecutor + "    fallback: {value: '{}', condition: exhaused}\n"),
		contains: `condition "exhaused" is not exhausted or any_error (did you mean exhausted?)`,
	},
	{
		name: "error code", code: definition.CodeErrorCode, pos: "8:22", path: "plans.p.errors.fatal[0]",
		src:      planSrc(oneExecutor + "    errors: {fatal: [\"-card\"]}\n"),
		contains: `error code "-card" is invalid`,
	},
	{
		name: "error code both retryable and fatal", code: definition.CodeErrorClassClash, pos: "8:58", path: "plans.p.errors.fatal[1]",
		src:      planSrc(oneExecutor + "    errors: {retryable: [timeout], fatal: [invalid_card, timeout]}\n"),
		contains: `error code "timeout" is both retryable and fatal`,
	},
	{
		name: "health without health-weighted", code: definition.CodeHealthIgnored, pos: "9:5", path: "plans.p.health",
		src:      planSrc("    selection: round-robin\n" + oneExecutor + "    health: {min_samples: 5}\n"),
		contains: "selection round-robin does not use health",
	},
	{
		name: "unused plan", code: definition.CodeUnusedPlan, pos: "6:3", path: "plans.p",
		src: `kind: Workflow
name: x
version: "1"
start: {run: "@actions/a", transitions: {success: flo.Completed}}
plans:
  p:
` + oneExecutor,
		contains: "no step runs plan p (@plan/p)",
	},
}

// planSrc is a workflow whose start step runs plan p; body holds p's fields,
// indented by four spaces, from line 7.
func planSrc(body string) string {
	return `kind: Workflow
name: x
version: "1"
start: {run: "@plan/p", transitions: {success: flo.Completed}}
plans:
  p:
` + body
}

// oneExecutor is the executors field of a plan with one executor.
const oneExecutor = "    executors: [{name: a, action: \"@actions/a\"}]\n"

func manyPlans(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "  p%d:\n%s", i, oneExecutor)
	}
	return b.String()
}

func manyTransitions(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString("    o")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(string(rune('a' + i%26)))
		b.WriteString(strings.Repeat("y", i/26))
		b.WriteString(": flo.Completed\n")
	}
	return b.String()
}

func TestEachCode(t *testing.T) {
	t.Parallel()
	for _, tt := range codeCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			def, diags, err := definition.Parse([]byte(tt.src))
			var found *definition.Diagnostic
			for i := range diags {
				if diags[i].Code == tt.code {
					found = &diags[i]
					break
				}
			}
			require.NotNil(t, found, "no %s among %v", tt.code, diags)
			require.Equal(t, tt.pos, found.Pos.String(), "position of %s", found)
			require.Contains(t, found.Message, tt.contains)
			if tt.path != "" {
				require.Equal(t, tt.path, found.Path, "path of %s", found)
			}
			if strings.HasPrefix(string(tt.code), "E") {
				require.Equal(t, definition.Error, found.Severity)
				var ve *definition.ValidationError
				require.ErrorAs(t, err, &ve)
				require.Nil(t, def)
				require.Contains(t, err.Error(), string(tt.code))
				return
			}
			require.Equal(t, definition.Warning, found.Severity)
			require.NoError(t, err, "a warning alone must not invalidate: %v", diags)
			require.NotNil(t, def)
		})
	}
}

func TestEveryCodeHasACase(t *testing.T) {
	t.Parallel()
	tested := map[definition.Code]bool{}
	for _, c := range codeCases {
		tested[c.code] = true
	}
	for _, info := range definition.Codes {
		require.True(t, tested[info.Code], "code %s has no test case", info.Code)
		wantSev := definition.Error
		if strings.HasPrefix(string(info.Code), "W") {
			wantSev = definition.Warning
		}
		require.Equal(t, wantSev, info.Severity, "severity of %s", info.Code)
	}
}

// TestREADMEListsEveryCode keeps the README's code table in step with Codes.
func TestREADMEListsEveryCode(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	require.NoError(t, err)
	row := regexp.MustCompile("(?m)^\\| `([EW]\\d{3})` \\|")
	inREADME := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		inREADME[m[1]] = true
	}
	inCode := map[string]bool{}
	for _, info := range definition.Codes {
		inCode[string(info.Code)] = true
		require.True(t, inREADME[string(info.Code)], "README.md lacks a row for %s", info.Code)
	}
	for code := range inREADME {
		require.True(t, inCode[code], "README.md documents %s, which definition.Codes lacks", code)
	}
}
