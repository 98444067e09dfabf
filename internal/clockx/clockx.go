// Package clockx is the time seam of the module. Acquire times are kept as
// nanoseconds since an epoch, so no time.Time is built on the hot path, and
// are read from a coarse clock: admissions share the reading of a ticker that
// runs only while admissions happen.
package clockx

import (
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

const (
	// CoarseTick is how often the coarse clock is refreshed while in use:
	// acquire times on the real clock are accurate to about this much.
	CoarseTick = 10 * time.Millisecond
	// coarseIdleTicks is how many ticks without a reading stop the ticker.
	coarseIdleTicks = 10
)

// Clock reads either the real clock or an injected clock.Clock.
// The zero value is not usable; call New.
type Clock struct {
	c     clock.Clock // nil means the real clock
	epoch time.Time

	coarse  atomic.Int64 // last tick's reading, valid while running
	running atomic.Bool  // a ticker goroutine is refreshing coarse
	used    atomic.Bool  // Coarse was read since the last tick
}

// New returns a Clock over c; a nil c means the real clock.
func New(c clock.Clock) *Clock {
	if c == nil {
		return &Clock{epoch: time.Now()}
	}
	return &Clock{c: c, epoch: c.Now()}
}

// Nanos returns the time elapsed since the epoch, exactly. On the real clock
// this is time.Since on a monotonic reading, which skips the wall-clock read.
func (c *Clock) Nanos() int64 {
	if c.c == nil {
		return int64(time.Since(c.epoch))
	}
	return int64(c.c.Now().Sub(c.epoch))
}

// WaitEnd is when a wait granted at grant (a reading of c) ends for the
// caller now waking: now, exactly, on the real clock, where the grant's
// reading may be coarse; the grant itself on an injected clock, which
// moves only when told, and may be moved before the caller runs.
func (c *Clock) WaitEnd(grant int64) int64 {
	if c.c != nil {
		return grant
	}
	return c.Nanos()
}

// Coarse returns Nanos to within about CoarseTick on the real clock, and
// exactly on an injected one or inside a testing/synctest bubble. The first
// reading after a quiet spell starts a ticker goroutine that refreshes the
// value every CoarseTick and ends by itself after coarseIdleTicks ticks in
// which nobody read it, so an idle owner leaves no goroutine behind (within
// about 100 ms, well inside goleak's retry window).
//
// It pays its way in BenchmarkRegistryTryAcquireRelease (package
// registry) and BenchmarkLimiterContended (package slots). With every read
// exact (Coarse as Nanos), over five interleaved runs on two cores, medians:
// the registry went from 0.91x to 1.15x its mutex+map baseline (target
// 0.8x), and the contended limiter from 0.85x to 1.70x x/sync/semaphore
// (target 1.0x); the uncontended limiter from 5.5x to 9.2x x/sync.
func (c *Clock) Coarse() int64 {
	if c.c != nil {
		return c.Nanos()
	}
	if c.running.Load() {
		// Write only when needed: every reader storing would bounce the
		// cache line between cores.
		if !c.used.Load() {
			c.used.Store(true)
		}
		return c.coarse.Load()
	}
	return c.startTicker()
}

// processStart is read at package init, which never runs inside a
// testing/synctest bubble. Round(0) drops its monotonic reading, so that
// comparisons with it are of wall clocks.
var processStart = time.Now().Round(0)

// inBubble reports whether the calling goroutine runs inside a
// testing/synctest bubble, whose fake clock starts at midnight UTC 2000-01-01
// and moves only with fake time: it then reads before the process started
// (or, on a machine whose wall clock is older still, before 2001). A ticker
// started there would be a goroutine of the bubble, and synctest.Test fails
// when the test returns while one still sleeps.
func inBubble() bool {
	now := time.Now()
	return now.Before(processStart) || now.Year() < 2001
}

func (c *Clock) startTicker() int64 {
	if inBubble() {
		return c.Nanos()
	}
	now := c.Nanos()
	c.coarse.Store(now)
	c.used.Store(true)
	if c.running.CompareAndSwap(false, true) {
		go c.tick()
	}
	return now
}

func (c *Clock) tick() {
	idle := 0
	for {
		time.Sleep(CoarseTick)
		c.coarse.Store(c.Nanos())
		if c.used.Swap(false) {
			idle = 0
			continue
		}
		if idle++; idle >= coarseIdleTicks {
			// A reader that saw running just before this store reads the
			// value of the last tick: still at most one tick old.
			c.running.Store(false)
			return
		}
	}
}

// Time converts a Nanos reading back to a time.Time.
func (c *Clock) Time(nanos int64) time.Time { return c.epoch.Add(time.Duration(nanos)) }

// Timer returns a timer on this clock.
func (c *Clock) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	if c.c == nil {
		t := time.NewTimer(d)
		return t.C, t.Stop
	}
	t := c.c.Timer(d)
	return t.C, t.Stop
}
