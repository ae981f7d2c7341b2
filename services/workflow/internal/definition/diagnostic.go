package definition

import (
	"fmt"
	"strings"

	"github.com/razorbill/flo/libs/fault"
)

// Severity says whether a diagnostic blocks a definition.
type Severity int

// The severities. An Error makes the definition invalid; a Warning is
// reported alongside a valid definition.
const (
	Error Severity = iota + 1
	Warning
)

func (s Severity) String() string {
	switch s {
	case Error:
		return "error"
	case Warning:
		return "warning"
	}
	return fmt.Sprintf("Severity(%d)", int(s))
}

// Position is a place in the YAML source, 1-based. Zero means unknown.
type Position struct {
	Line   int
	Column int
}

func (p Position) String() string {
	switch {
	case p.Line == 0:
		return "-"
	case p.Column == 0:
		return fmt.Sprintf("%d", p.Line)
	}
	return fmt.Sprintf("%d:%d", p.Line, p.Column)
}

// Code is a stable diagnostic code: E1xx structure, E2xx target references,
// E3xx transitions, E4xx duplicates, E5xx signals, timers and retry values,
// E6xx plans, E70x schedules, E72x search attributes, E74x stream triggers.
// Warnings use W and the number of their category.
type Code string

// Structure.
const (
	CodeSyntax        Code = "E100" // the source is not valid YAML
	CodeDocument      Code = "E101" // empty, not a mapping, several documents, or too large
	CodeMissingField  Code = "E102" // a required field is absent or empty
	CodeKind          Code = "E103" // kind is not Workflow
	CodeUnknownField  Code = "E104" // a field the language does not have
	CodeType          Code = "E105" // a value of the wrong YAML type
	CodeName          Code = "E106" // workflow name or version malformed
	CodeIdempotency   Code = "E107" // idempotency not none, optional or required
	CodeStepKind      Code = "E108" // a step needs exactly one of run and waitForSignal
	CodeNoTransitions Code = "E109" // a step with no way forward
	CodeStepName      Code = "E110" // step name malformed or reserved
	CodeTerminal      Code = "E111" // custom terminal name or status invalid
	CodeRunOnly       Code = "E112" // retry, poll or inputMapping on a waitForSignal step
	CodeInputMapping  Code = "E113" // inputMapping is not a JSON template
	CodeMergeKey      Code = "E114" // YAML merge keys are not supported
	CodeLimit         Code = "E115" // too many steps, terminals, transitions, plans or executors
)

// Target references.
const (
	CodeTarget        Code = "E201" // run is not @actions/NAME, @workflow/NAME[:VERSION] or @plan/NAME
	CodeTargetName    Code = "E202" // the name in a target is malformed
	CodeUnknownPlan   Code = "E203" // @plan/NAME names no plan of this workflow
	CodeTargetVersion Code = "E204" // the version in @workflow/NAME:VERSION is malformed
	CodeMappingPath   Code = "E205" // an inputMapping path is malformed
	CodeMappingStep   Code = "E206" // an inputMapping or cache key path names a step that does not exist
)

// Transitions.
const (
	CodeTransitionTarget Code = "E301" // a transition or onTimeout goes nowhere known
	CodeOutcomeName      Code = "E302" // an outcome name is malformed
	CodeSignalOutcome    Code = "E303" // a waitForSignal step has only a success transition
	CodeUnreachable      Code = "W301" // a step no path from start reaches
)

// Duplicates.
const (
	CodeDuplicateStep     Code = "E401" // two steps with one name
	CodeDuplicateTerminal Code = "E402" // two terminals with one name
	CodeStepTerminalClash Code = "E403" // a step and a terminal with one name
	CodeDuplicateKey      Code = "E404" // a field or outcome written twice
	CodeDuplicateExecutor Code = "E405" // two executors of one plan with one name
	CodeDuplicatePlan     Code = "E406" // two plans with one name
)

// Signals, timers and retry policies.
const (
	CodeSignalType           Code = "E501" // waitForSignal.type absent or malformed
	CodeSignalTimeout        Code = "E502" // timeoutMs out of range
	CodeOnTimeoutNoTimeout   Code = "E503" // onTimeout without timeoutMs never fires
	CodeBackoff              Code = "E504" // unknown backoff strategy
	CodeMaxAttempts          Code = "E505" // max_attempts or maxAttempts out of range
	CodeDelay                Code = "E506" // a delay or budget out of range or inconsistent
	CodeMultiplier           Code = "E507" // multiplier out of range
	CodeNoSignalTimeout      Code = "W501" // waitForSignal without timeoutMs may wait forever
	CodePollWithoutTimeoutTo Code = "W502" // poll without a timeout transition fails the run when polls run out
)

// Plans.
const (
	CodePlanName          Code = "E601" // plan name malformed
	CodeNoExecutors       Code = "E602" // a plan without executors
	CodeExecutorName      Code = "E603" // executor name absent or malformed
	CodeExecutorAction    Code = "E604" // executor action absent or not @actions/NAME
	CodeSelection         Code = "E605" // unknown selection
	CodeHealthRequired    Code = "E606" // health-weighted without health
	CodeHealthDecay       Code = "E607" // decay not in (0, 1]
	CodeHealthMinSamples  Code = "E608" // min_samples out of range
	CodeHealthWindow      Code = "E609" // window_ms out of range
	CodeBreaker           Code = "E610" // a breaker value out of range
	CodeRateLimit         Code = "E611" // a rate limit out of range
	CodeTrackingMode      Code = "E612" // tracking mode not sync or async
	CodeTrackingTimeout   Code = "E613" // timeout_ms out of range or with mode sync
	CodeCacheIncomplete   Code = "E614" // cache without key or ttl_ms
	CodeCacheTTL          Code = "E615" // ttl_ms out of range
	CodeCacheKey          Code = "E616" // cache key template invalid
	CodeInvalidateEvent   Code = "E617" // an invalidate_on event name malformed
	CodeFallbackValue     Code = "E618" // fallback value absent or not JSON
	CodeFallbackCondition Code = "E619" // fallback condition unknown
	CodeErrorCode         Code = "E620" // an error code malformed
	CodeErrorClassClash   Code = "E621" // a code both retryable and fatal
	CodeHealthIgnored     Code = "W601" // health with a selection that does not use it
	CodeUnusedPlan        Code = "W602" // a plan no step runs
)

// Schedules.
const (
	CodeScheduleKind  Code = "E701" // both or neither of cron and interval
	CodeCron          Code = "E702" // cron is not a 5-field expression
	CodeInterval      Code = "E703" // interval out of range
	CodeMaxConcurrent Code = "E704" // max_concurrent out of range
	CodeScheduleInput Code = "E705" // schedule input is not JSON
	CodeTimezone      Code = "E706" // unknown time zone, or one on an interval
)

// Search attributes.
const (
	CodeAttributeName      Code = "E721" // attribute name absent or malformed
	CodeAttributeType      Code = "E722" // attribute type absent or unknown
	CodeAttributeFrom      Code = "E723" // from absent, not into the input, or not singular
	CodeDuplicateAttribute Code = "E724" // two attributes with one name
	CodeAttributeReserved  Code = "E725" // a built-in field or query keyword as a name
	CodeScheduleAttribute  Code = "E726" // the schedule's input gives an attribute a wrong-typed value
)

// Stream triggers.
const (
	CodeTriggerStream    Code = "E741" // stream absent or malformed
	CodeTriggerNamespace Code = "E742" // namespace malformed
	CodeTriggerGroup     Code = "E743" // consumer_group malformed, or the default too long
	CodeTriggerMode      Code = "E744" // mode not shared, exclusive or key_shared
	CodeTriggerBatch     Code = "E745" // batch_size out of range
)

// CodeInfo documents one code.
type CodeInfo struct {
	Code     Code
	Severity Severity
	Summary  string
}

// Codes lists every diagnostic code with its meaning; the README's table is
// checked against it.
var Codes = []CodeInfo{
	{CodeSyntax, Error, "The source is not valid YAML."},
	{CodeDocument, Error, "The source is empty, is not a mapping, holds several documents, or is larger than 1 MiB."},
	{CodeMissingField, Error, "A required field is absent or empty: kind, name, version, start."},
	{CodeKind, Error, "kind is not Workflow."},
	{CodeUnknownField, Error, "A field the language does not have (typos are errors; the message suggests the closest field)."},
	{CodeType, Error, "A value of the wrong type, e.g. a mapping where a string belongs, or a fraction where an integer belongs."},
	{CodeName, Error, "The workflow name (1–128 letters, digits, '.', '_', '-') or version (1–64 letters, digits, '.', '_', '+', '-') is malformed."},
	{CodeIdempotency, Error, "idempotency is not none, optional or required."},
	{CodeStepKind, Error, "A step has both or neither of run and waitForSignal."},
	{CodeNoTransitions, Error, "A run step has no transitions, or a waitForSignal step has no success transition."},
	{CodeStepName, Error, "A step name is malformed (a letter or '_' then letters, digits, '_', '-') or reserved (_start)."},
	{CodeTerminal, Error, "A custom terminal's name is malformed or reserved (flo.*), or its status is not completed, failed, cancelled or timed_out."},
	{CodeRunOnly, Error, "retry, poll or inputMapping on a waitForSignal step; they apply to run steps only."},
	{CodeInputMapping, Error, "inputMapping is not a JSON template: invalid JSON, a key written twice, or nested too deeply."},
	{CodeMergeKey, Error, "A YAML merge key (<<); anchors and aliases work, merges do not."},
	{CodeLimit, Error, "Too many steps (1000), custom terminals (1000), transitions in one step (64), plans (100), executors in one plan (32), search attributes (32), or entries in one invalidate_on or error code list (100)."},
	{CodeTarget, Error, "run is not @actions/NAME, @workflow/NAME[:VERSION] or @plan/NAME."},
	{CodeTargetName, Error, "The action, workflow or plan name in a target is malformed."},
	{CodeUnknownPlan, Error, "@plan/NAME names no plan of this workflow (the message suggests the closest plan)."},
	{CodeTargetVersion, Error, "The version in @workflow/NAME:VERSION is empty or malformed."},
	{CodeMappingPath, Error, "An inputMapping path is not one of $.input…, $.steps.NAME.output…, $.steps.NAME.outcome, $.flo.run_id, $.flo.timestamp, or its JSONPath is invalid."},
	{CodeMappingStep, Error, "An inputMapping path or a cache key placeholder names a step the workflow does not have."},
	{CodeTransitionTarget, Error, "A transition or onTimeout target is not a step, a custom terminal or a built-in terminal."},
	{CodeOutcomeName, Error, "An outcome name is malformed (letters, digits, '_', '.', '-')."},
	{CodeSignalOutcome, Error, "A waitForSignal step has a transition other than success; use onTimeout for timeouts."},
	{CodeUnreachable, Warning, "A step that no path from start reaches."},
	{CodeDuplicateStep, Error, "Two steps with the same name."},
	{CodeDuplicateTerminal, Error, "Two custom terminals with the same name."},
	{CodeStepTerminalClash, Error, "A step and a custom terminal with the same name."},
	{CodeDuplicateKey, Error, "A field or outcome written twice in one mapping."},
	{CodeDuplicateExecutor, Error, "Two executors of one plan with the same name."},
	{CodeDuplicatePlan, Error, "Two plans with the same name."},
	{CodeSignalType, Error, "waitForSignal.type is absent or malformed."},
	{CodeSignalTimeout, Error, "timeoutMs is not between 1 and 31536000000 (365 days)."},
	{CodeOnTimeoutNoTimeout, Error, "onTimeout without timeoutMs can never fire."},
	{CodeBackoff, Error, "backoff is not constant, linear, exponential or exponential_jitter."},
	{CodeMaxAttempts, Error, "retry max_attempts is not between 1 and 1000, or poll maxAttempts not between 1 and 10000."},
	{CodeDelay, Error, "A delay is negative or above 604800000 (7 days), a maximum is below its initial or base delay, or within_ms is not between 1 and 31536000000."},
	{CodeMultiplier, Error, "multiplier is not between 1 and 100."},
	{CodeNoSignalTimeout, Warning, "A waitForSignal step without timeoutMs waits for its signal forever."},
	{CodePollWithoutTimeoutTo, Warning, "A step with poll has no timeout transition: when polls run out the run fails."},
	{CodePlanName, Error, "A plan name is malformed (1–128 letters, digits, '.', '_', '-', starting with a letter or digit)."},
	{CodeNoExecutors, Error, "A plan has no executors; it needs at least one."},
	{CodeExecutorName, Error, "An executor has no name, or its name is malformed (as a plan name)."},
	{CodeExecutorAction, Error, "An executor has no action, or its action is not @actions/NAME."},
	{CodeSelection, Error, "selection is not static-order, round-robin, random or health-weighted."},
	{CodeHealthRequired, Error, "selection health-weighted without a health block."},
	{CodeHealthDecay, Error, "health decay is not in (0, 1]."},
	{CodeHealthMinSamples, Error, "health min_samples is not between 1 and 10000."},
	{CodeHealthWindow, Error, "health window_ms is not between 1 and 604800000 (7 days)."},
	{CodeBreaker, Error, "breaker failure_threshold or half_open_max_calls is not between 1 and 10000, or cooldown_ms not between 1 and 604800000."},
	{CodeRateLimit, Error, "A rate_limit value (max_per_second, max_per_minute, max_per_hour) is not between 1 and 1000000000."},
	{CodeTrackingMode, Error, "tracking mode is not sync or async."},
	{CodeTrackingTimeout, Error, "tracking timeout_ms is not between 1 and 31536000000 (365 days), or is set with mode sync."},
	{CodeCacheIncomplete, Error, "A cache block without key or ttl_ms."},
	{CodeCacheTTL, Error, "cache ttl_ms is not between 1 and 31536000000 (365 days)."},
	{CodeCacheKey, Error, "A cache key template is invalid: an unclosed or unopened brace, a malformed placeholder path, or one that can select several values."},
	{CodeInvalidateEvent, Error, "An invalidate_on event name is malformed (1–128 letters, digits, '_', '.', ':', '-')."},
	{CodeFallbackValue, Error, "A fallback has no value, or its value is not JSON text."},
	{CodeFallbackCondition, Error, "fallback condition is not exhausted or any_error."},
	{CodeErrorCode, Error, "An error code in errors.retryable or errors.fatal is malformed (1–64 letters, digits, '_', '.', ':', '-')."},
	{CodeErrorClassClash, Error, "An error code listed both as retryable and as fatal."},
	{CodeHealthIgnored, Warning, "A health block with a selection other than health-weighted, which does not use it."},
	{CodeUnusedPlan, Warning, "A plan that no step runs."},
	{CodeScheduleKind, Error, "A schedule has both cron and interval, or neither."},
	{CodeCron, Error, "cron is not a standard 5-field expression (minute hour day-of-month month day-of-week; * , - / and names), or carries a TZ=/CRON_TZ= prefix (use timezone)."},
	{CodeInterval, Error, "interval is not between 1 and 31536000000 milliseconds (365 days)."},
	{CodeMaxConcurrent, Error, "max_concurrent is not between 1 and 1000."},
	{CodeScheduleInput, Error, "The schedule's input is not JSON text."},
	{CodeTimezone, Error, "timezone is not an IANA time zone, or is set on an interval schedule."},
	{CodeAttributeName, Error, "A search attribute has no name, or its name is malformed (1–128 letters, digits, '.', '_', '-', starting with a letter)."},
	{CodeAttributeType, Error, "A search attribute has no type, or its type is not string, number or timestamp."},
	{CodeAttributeFrom, Error, "A search attribute has no from, or from is not a path into the input (input.FIELD…) that selects one value."},
	{CodeDuplicateAttribute, Error, "Two search attributes with the same name."},
	{CodeAttributeReserved, Error, "A search attribute named like a built-in query field (workflow, status, started_at, finished_at) or keyword (and, or, in), in any case."},
	{CodeScheduleAttribute, Error, "The schedule's input gives a search attribute a value of the wrong type, which would refuse every scheduled run."},
	{CodeTriggerStream, Error, "A trigger has no stream, or its stream name is malformed (1–128 letters, digits, '.', '_', '-', not starting with '.' or '-')."},
	{CodeTriggerNamespace, Error, "A trigger's namespace is malformed (1–128 letters, digits, '.', '_', '-', starting with a letter or digit)."},
	{CodeTriggerGroup, Error, "A trigger's consumer_group is malformed (as a stream name), or the default wf-NAME would be longer than 128 bytes."},
	{CodeTriggerMode, Error, "A trigger's mode is not shared, exclusive or key_shared."},
	{CodeTriggerBatch, Error, "A trigger's batch_size is not between 1 and 1000."},
}

// Diagnostic is one problem found in a definition.
type Diagnostic struct {
	Code     Code
	Severity Severity
	Pos      Position
	// Path names the place in the definition, e.g. steps.charge.retry.backoff.
	Path    string
	Message string
}

// String renders the diagnostic as LINE:COL CODE PATH: MESSAGE.
func (d Diagnostic) String() string {
	var b strings.Builder
	b.WriteString(d.Pos.String())
	b.WriteString(" ")
	b.WriteString(string(d.Code))
	if d.Path != "" {
		b.WriteString(" ")
		b.WriteString(d.Path)
	}
	b.WriteString(": ")
	b.WriteString(d.Message)
	return b.String()
}

// ValidationError is returned when a definition has errors. Diagnostics holds
// every diagnostic, warnings included.
type ValidationError struct {
	Diagnostics []Diagnostic
}

// maxErrorsInMessage bounds how many errors Error spells out.
const maxErrorsInMessage = 10

func (e *ValidationError) Error() string {
	var errs []string
	for _, d := range e.Diagnostics {
		if d.Severity == Error {
			errs = append(errs, d.String())
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "invalid workflow definition (%d error", len(errs))
	if len(errs) != 1 {
		b.WriteString("s")
	}
	b.WriteString("): ")
	shown := errs
	if len(shown) > maxErrorsInMessage {
		shown = shown[:maxErrorsInMessage]
	}
	b.WriteString(strings.Join(shown, "; "))
	if len(errs) > len(shown) {
		fmt.Fprintf(&b, "; and %d more", len(errs)-len(shown))
	}
	return b.String()
}

// Unwrap makes the error an Invalid domain error (libs/fault), so the gRPC
// edge reports it as invalid input.
func (e *ValidationError) Unwrap() error {
	return &fault.Error{Kind: fault.Invalid, Message: e.Error()}
}
