package slots

import (
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
)

// An Option configures a Limiter. The same options configure the waits of
// a registry.Registry and of a fleet Registry's local side, which accept
// them beside their own (registry.WithShards, say, which a Limiter refuses).
type Option interface {
	// Apply sets the option. It is for this module's packages: its
	// argument cannot be named outside them, so an Option comes from one
	// of the With functions.
	Apply(*core.Settings)
}

type optionFunc func(*core.Policy)

func (f optionFunc) Apply(s *core.Settings) { f(&s.Policy) }

// WithMaxWait bounds how long Acquire waits. When d passes, Acquire fails with
// ErrWaitTimeout, or with WithFailOpen admits a Bypassed slot. d <= 0 (the
// default) waits until the context ends.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(w *core.Policy) { w.MaxWait = d })
}

// WithMaxQueue bounds how many callers may wait at once; when n are waiting,
// the newest caller is rejected at once with ErrQueueFull. n = 0 means Acquire
// never waits. The default is no bound; a negative n restores it.
func WithMaxQueue(n int) Option {
	return optionFunc(func(w *core.Policy) { w.MaxQueue, w.BoundQueue = n, n >= 0 })
}

// WithFailOpen makes Acquire proceed after the maximum wait with a Bypassed
// slot that holds no capacity, instead of failing: a hung upstream then
// cannot stall every caller behind the limiter. Each bypass is counted in
// Stats and logged as saturation at most once every 10 seconds. Without
// WithMaxWait it has no effect.
func WithFailOpen() Option {
	return optionFunc(func(w *core.Policy) { w.FailOpen = true })
}

// WithClock sets the clock used for acquire times and the maximum wait; for
// tests. The default is the real clock.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(w *core.Policy) { w.Clock = c })
}

// WithLogger sets the logger for saturation and misuse warnings. nil (the
// default) means slog.Default(), looked up each time a line is logged. Warnings
// name slot ids only; nothing per request is logged above Debug.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(w *core.Policy) { w.Logger = l })
}

// WithObserver sets an Observer of admissions, rejections and releases, for
// metrics (see Observer). The default is none, which costs nothing.
func WithObserver(o Observer) Option {
	return optionFunc(func(w *core.Policy) {
		if o != nil {
			w.Observer = func(e core.Event) {
				o.Observe(Event{Kind: EventKind(e.Kind), Err: e.Err, Wait: e.Wait, Hold: e.Hold, Context: e.Ctx, Units: e.Units})
			}
		}
	})
}

// WithLeakDetection makes a Slot that is dropped without Release, and
// collected by the garbage collector while still held, give its capacity
// back; the leak is logged (slot id, how long it was held) and reported as
// EventLeaked. It is a safety net for a missed Release, not a way to
// release: the collector runs when it will. It costs two more allocations
// (the tracked hold and a weak pointer to the Slot) and a cleanup
// registration per admission, several times an admission's cost (see
// BenchmarkRegistryTryAcquireRelease/inflight-leakcheck), so it is off by
// default; turn it on in tests and where leaks are suspected.
//
// Do not use it with testing/synctest bubbles in which callers wait for
// slots: the runtime runs cleanups outside every bubble, and a reclaimed slot
// granted to a waiter inside one wakes that waiter from outside, which the
// runtime treats as a fatal error.
func WithLeakDetection() Option {
	return optionFunc(func(w *core.Policy) { w.LeakCheck = true })
}

// WithLeakSites is WithLeakDetection that also records where each slot was
// acquired (the caller's stack, about a microsecond per admission), and names
// that place in the leak warning.
func WithLeakSites() Option {
	return optionFunc(func(w *core.Policy) { w.LeakCheck, w.LeakSites = true, true })
}
