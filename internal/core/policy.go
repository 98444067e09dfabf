package core

import (
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// Policy is how an owner's callers wait, and what it reports: set by
// options before the owner is used, read-only after. The zero value waits
// without bound, queues without bound, fails closed, uses the real clock
// and slog.Default, and reports to no one.
type Policy struct {
	MaxWait    time.Duration // <= 0: wait until the context ends
	MaxQueue   int           // with BoundQueue: at most this many waiters
	BoundQueue bool          // false: the queue is unbounded
	FailOpen   bool          // on MaxWait, admit a bypassed slot instead of failing
	Clock      clock.Clock   // nil: the real clock
	Logger     *slog.Logger  // nil: slog.Default() at the time of logging
	Observer   func(Event)   // nil: no events
	LeakCheck  bool          // reclaim and report Slots dropped while held
	LeakSites  bool          // with LeakCheck: record where each slot was acquired

	MaxFlowQueue   int     // with BoundFlowQueue: at most this many waiters per flow
	BoundFlowQueue bool    // false: flows are not bounded apart from the queue
	Shares         *Shares // nil: no class has a guaranteed share
}

// SetShare sets class c's guaranteed share.
func (w *Policy) SetShare(c uint8, minimum, reserved int) {
	if w.Shares == nil {
		w.Shares = new(Shares)
	}
	w.Shares.Min[c], w.Shares.Reserved[c] = minimum, reserved
}

// FlowQueueFull reports whether a caller whose flow has waiting callers
// must be rejected instead of queued.
func (w *Policy) FlowQueueFull(waiting int) bool {
	return w.BoundFlowQueue && waiting >= w.MaxFlowQueue
}

// QueueFull reports whether a caller finding waiting callers ahead must be
// rejected instead of queued.
func (w *Policy) QueueFull(waiting int) bool { return w.BoundQueue && waiting >= w.MaxQueue }

// Log returns the logger to use now.
func (w *Policy) Log() *slog.Logger {
	if w.Logger != nil {
		return w.Logger
	}
	return slog.Default()
}

// Every lets an event through at most once per interval; for log lines that
// must not flood under saturation. The zero value lets the first one through.
type Every struct{ next atomic.Int64 }

// Allow reports whether the event at now (nanoseconds, any monotonic origin)
// may be logged, and if so suppresses the following ones for interval.
func (e *Every) Allow(now int64, interval time.Duration) bool {
	next := e.next.Load()
	if now < next && next != 0 {
		return false
	}
	return e.next.CompareAndSwap(next, now+int64(interval))
}

// HoldTime is a running estimate of how long holders keep their capacity,
// fed by a sample of releases. Lock-free; the zero value has no estimate.
type HoldTime struct{ ewma atomic.Int64 }

// SampleMask picks the releases that feed the estimate (IDs with these bits
// clear), so that most releases do not read the clock.
const SampleMask = 15

// Observe folds one hold duration (nanoseconds) into the estimate.
func (t *HoldTime) Observe(d int64) {
	if d < 0 {
		return
	}
	old := t.ewma.Load()
	if old == 0 {
		t.ewma.Store(d)
		return
	}
	// A lost update under a race only drops one sample.
	t.ewma.Store(old + (d-old)/8)
}

// MaxRetryAfter caps the estimate: past an hour it says nothing useful.
const MaxRetryAfter = time.Hour

// RetryAfter estimates when a caller rejected now might be admitted: the
// queue ahead of it drains at about limit holders per mean hold time. Never
// less than one second, which is also the answer when nothing is known, and
// never more than MaxRetryAfter.
func (t *HoldTime) RetryAfter(queued, limit int) time.Duration {
	const floor = time.Second
	mean := t.ewma.Load()
	if mean <= 0 || limit <= 0 {
		return floor
	}
	d := float64(mean) * float64(queued+1) / float64(limit) // float: no overflow
	d = min(max(d, float64(floor)), float64(MaxRetryAfter))
	// Rounded up: a client that honours it does not come back early.
	return time.Duration(math.Ceil(d/float64(time.Second))) * time.Second
}

// Settings is what the module's options set: the Policy, which every owner
// reads, and what a Registry alone reads, which other owners refuse
// (RegistryOnly names the first option that set it).
type Settings struct {
	Policy
	Shards       int
	MaxKeyBytes  int
	RegistryOnly string
}
