// Package millis turns the API's int64 milliseconds into durations without
// overflow: a time.Duration holds about 292 years, and milliseconds past
// that would wrap into negative or small values instead of meaning "a very
// long time", so every bound checked afterwards would judge the wrong number.
package millis

import (
	"math"
	"time"
)

// maxMS is the largest millisecond count a time.Duration can hold.
const maxMS = math.MaxInt64 / int64(time.Millisecond)

// Duration returns ms milliseconds, saturated at the largest (or most
// negative) time.Duration.
func Duration(ms int64) time.Duration {
	switch {
	case ms > maxMS:
		return math.MaxInt64
	case ms < -maxMS:
		return -math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}
