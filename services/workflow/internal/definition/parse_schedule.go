package definition

import (
	"bytes"
	"encoding/json"
	"time"

	"go.yaml.in/yaml/v3"
)

var scheduleFields = []string{"cron", "interval", "timezone", "max_concurrent", "input", "paused"}

// schedule reads the schedule section into def.Schedule; nil when it has
// errors.
func (p *parser) schedule(f field, def *Definition) {
	fields := p.object(f.value, f.path, "the schedule", scheduleFields)
	if fields == nil {
		return
	}
	before := len(p.diags)
	s := &Schedule{MaxConcurrent: 1, Input: json.RawMessage(DefaultScheduleInput), Location: time.UTC, Pos: pos(f.key)}
	cf, hasCron := fields["cron"]
	inf, hasInterval := fields["interval"]
	switch {
	case hasCron && hasInterval:
		p.errorf(CodeScheduleKind, inf.key, inf.path, "a schedule has cron or interval, not both")
	case !hasCron && !hasInterval:
		p.errorf(CodeScheduleKind, f.key, f.path, "a schedule needs cron (e.g. \"*/5 * * * *\") or interval (milliseconds)")
	}
	if tf, ok := fields["timezone"]; ok {
		if v, ok := p.str(tf, false); ok {
			loc, err := time.LoadLocation(v)
			switch {
			case v == "" || err != nil:
				p.errorf(CodeTimezone, tf.value, tf.path, "timezone %q is not an IANA time zone such as Europe/Paris or UTC", clip(v))
			case !hasCron:
				p.errorf(CodeTimezone, tf.key, tf.path, "timezone applies to cron schedules only; an interval counts milliseconds")
			default:
				s.Location = loc
			}
		}
	}
	if hasCron {
		if v, ok := p.str(cf, false); ok {
			spec, err := parseCron(v, s.Location)
			if err != nil {
				p.errorf(CodeCron, cf.value, cf.path, "cron %q is not a 5-field expression (minute hour day-of-month month day-of-week): %s", clip(v), err)
			} else {
				s.Cron, s.spec = v, spec
			}
		}
	}
	if hasInterval && !hasCron {
		if v, ok := p.integer(inf); ok {
			if v < 1 || v > MaxScheduleInterval.Milliseconds() {
				p.errorf(CodeInterval, inf.value, inf.path, "interval must be between 1 and %d milliseconds, not %d", MaxScheduleInterval.Milliseconds(), v)
			} else {
				s.Interval = time.Duration(v) * time.Millisecond
			}
		}
	}
	if mf, ok := fields["max_concurrent"]; ok {
		s.MaxConcurrent = p.count(mf, CodeMaxConcurrent, MaxScheduleRuns, 1)
	}
	if jf, ok := fields["input"]; ok {
		if v, ok := p.str(jf, false); ok {
			var b bytes.Buffer
			if err := json.Compact(&b, []byte(v)); err != nil {
				p.errorf(CodeScheduleInput, jf.value, jf.path, "input is not JSON (%s); write JSON in a string, e.g. '{\"mode\": \"full\"}'", err)
			} else {
				s.Input = b.Bytes()
			}
		}
	}
	if pf, ok := fields["paused"]; ok {
		s.Paused = p.boolean(pf)
	}
	if len(p.diags) == before {
		def.Schedule = s
	}
}

// boolean reads a true or false scalar; false when it is not one.
func (p *parser) boolean(f field) bool {
	var v bool
	if f.value.Kind == yaml.ScalarNode && f.value.Tag == "!!bool" && f.value.Decode(&v) == nil {
		return v
	}
	p.errorf(CodeType, f.value, f.path, "%s must be true or false, not %s", f.name, describe(f.value))
	return false
}
