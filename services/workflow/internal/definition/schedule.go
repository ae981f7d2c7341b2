package definition

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	// Time zones resolve the same on every host, images without a zoneinfo
	// database included.
	_ "time/tzdata"

	"github.com/robfig/cron/v3"
)

// Limits on schedules.
const (
	MaxScheduleInterval = 365 * 24 * time.Hour
	MaxScheduleRuns     = 1000
)

// DefaultScheduleInput is the input of scheduled runs when the schedule
// names none.
const DefaultScheduleInput = "{}"

// Schedule starts runs of a workflow on a cron expression or at a fixed
// interval.
type Schedule struct {
	// Cron is the 5-field expression as written; empty for an interval.
	Cron string
	// Location is the time zone Cron is read in: UTC unless the schedule
	// names one.
	Location *time.Location
	// Interval is the time between ticks; zero for a cron schedule.
	Interval time.Duration
	// MaxConcurrent bounds the runs this schedule started that are still
	// going; a tick at the bound is skipped.
	MaxConcurrent int
	// Input is the scheduled runs' JSON input.
	Input json.RawMessage
	// Paused schedules keep their row but start nothing.
	Paused bool
	Pos    Position

	spec cron.Schedule
}

// First returns the schedule's first tick after now.
func (s *Schedule) First(now time.Time) time.Time {
	if s.spec != nil {
		return s.spec.Next(now)
	}
	return now.Add(s.Interval)
}

// Next returns the tick after tick that is later than now. After downtime
// the ticks missed in between are skipped: an interval schedule keeps its
// grid (tick + k·Interval), a cron schedule its expression.
func (s *Schedule) Next(tick, now time.Time) time.Time {
	if s.spec != nil {
		return s.spec.Next(now)
	}
	if !now.Before(tick) {
		tick = tick.Add(now.Sub(tick).Truncate(s.Interval))
	}
	return tick.Add(s.Interval)
}

// Describe is the schedule in one line: the cron expression (with its time
// zone when it is not UTC) or "every N ms".
func (s *Schedule) Describe() string {
	if s.Cron == "" {
		return fmt.Sprintf("every %d ms", s.Interval.Milliseconds())
	}
	if s.Location != nil && s.Location != time.UTC {
		return s.Cron + " (" + s.Location.String() + ")"
	}
	return s.Cron
}

// cronParser reads the standard 5 fields, without descriptors (@daily) or
// seconds.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// parseCron reads a 5-field cron expression in loc. Day of week 7 is Sunday,
// as in crontab; the library knows only 0.
func parseCron(expr string, loc *time.Location) (sched cron.Schedule, err error) {
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, fmt.Errorf("name the time zone in the schedule's timezone field, not in the expression")
	}
	fields := strings.Fields(expr)
	if len(fields) != 5 {
		return nil, fmt.Errorf("want 5 fields (minute hour day-of-month month day-of-week), found %d", len(fields))
	}
	if fields[4], err = sundaySeven(fields[4]); err != nil {
		return nil, err
	}
	defer func() {
		// The library has panicked on odd input before; a definition
		// must never take the parser down.
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("unreadable expression")
		}
	}()
	sched, err = cronParser.Parse(strings.Join(fields, " "))
	if err != nil {
		return nil, err
	}
	if spec, ok := sched.(*cron.SpecSchedule); ok {
		spec.Location = loc
	}
	if sched.Next(time.Now()).IsZero() {
		// The library looks five years ahead: e.g. 30 February.
		return nil, fmt.Errorf("it matches no date")
	}
	return sched, nil
}

// sundaySeven rewrites a day-of-week field so that 7 means Sunday (0): a
// range or step reaching 7 is spelled out as a list.
func sundaySeven(field string) (string, error) {
	parts := strings.Split(field, ",")
	for i, part := range parts {
		rng, step, hasStep := strings.Cut(part, "/")
		lo, hi, isRange := strings.Cut(rng, "-")
		switch {
		case !isRange && !hasStep && rng == "7":
			parts[i] = "0"
		case isRange && hi == "7":
			from, err := strconv.Atoi(lo)
			if err != nil || from < 0 || from > 7 {
				return "", fmt.Errorf("day-of-week range %q does not start at 0 to 7", part)
			}
			by := 1
			if hasStep {
				if by, err = strconv.Atoi(step); err != nil || by < 1 {
					return "", fmt.Errorf("day-of-week step %q is not a positive number", part)
				}
			}
			var days []string
			for d := from; d <= 7; d += by {
				days = append(days, strconv.Itoa(d%7))
			}
			parts[i] = strings.Join(days, ",")
		}
	}
	return strings.Join(parts, ","), nil
}
