// Package clockx is the time seam of the module: acquire times are kept as
// nanoseconds since an epoch so that the hot path reads one monotonic clock
// (about half the cost of time.Now) and never builds a time.Time.
package clockx

import (
	"time"

	"github.com/benbjohnson/clock"
)

// Clock reads either the real monotonic clock or an injected clock.Clock.
// The zero value is not usable; call New.
type Clock struct {
	c     clock.Clock // nil means the real clock
	epoch time.Time
}

// New returns a Clock over c; a nil c means the real clock.
func New(c clock.Clock) *Clock {
	if c == nil {
		return &Clock{epoch: time.Now()}
	}
	return &Clock{c: c, epoch: c.Now()}
}

// Nanos returns the time elapsed since the epoch. On the real clock this is
// time.Since on a monotonic reading, which skips the wall-clock read.
func (c *Clock) Nanos() int64 {
	if c.c == nil {
		return int64(time.Since(c.epoch))
	}
	return int64(c.c.Now().Sub(c.epoch))
}

// Time converts a Nanos reading back to a time.Time.
func (c *Clock) Time(nanos int64) time.Time { return c.epoch.Add(time.Duration(nanos)) }

// Now returns the current time.
func (c *Clock) Now() time.Time { return c.Time(c.Nanos()) }

// Timer returns a timer on this clock.
func (c *Clock) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	if c.c == nil {
		t := time.NewTimer(d)
		return t.C, t.Stop
	}
	t := c.c.Timer(d)
	return t.C, t.Stop
}
