package harness

import (
	"sync/atomic"
	"time"
)

// Clock is a clock a test moves by hand, for code that takes a Now
// function: tests advance it instead of sleeping. It is safe for concurrent
// use.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock {
	c := &Clock{}
	c.Set(t)
	return c
}

// Now is the clock's time, in UTC.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
