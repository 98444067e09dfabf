package slots

import (
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
)

// An Option configures a Limiter, or the waits of a registry.Registry.
type Option interface {
	// Apply is for this module's packages; use the With functions.
	Apply(*core.Settings)
}

type optionFunc func(*core.Policy)

func (f optionFunc) Apply(s *core.Settings) { f(&s.Policy) }

// WithMaxWait bounds a wait (ErrWaitTimeout); d <= 0, the default: no bound.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(w *core.Policy) { w.MaxWait = d })
}

// WithMaxQueue bounds the waiters (ErrQueueFull); 0: none; < 0: no bound.
func WithMaxQueue(n int) Option {
	return optionFunc(func(w *core.Policy) { w.MaxQueue, w.BoundQueue = n, n >= 0 })
}

// WithFailOpen lets a wait that reaches WithMaxWait through, Bypassed.
func WithFailOpen() Option {
	return optionFunc(func(w *core.Policy) { w.FailOpen = true })
}

// WithClock sets the clock of acquire times and waits; for tests.
func WithClock(c clock.Clock) Option {
	return optionFunc(func(w *core.Policy) { w.Clock = c })
}

// WithLogger sets the logger of saturation and misuse warnings (nil, the
// default: slog.Default()). Nothing per request is logged above Debug.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(w *core.Policy) { w.Logger = l })
}

// WithObserver sets an Observer of admissions, refusals and releases.
func WithObserver(o Observer) Option {
	return optionFunc(func(w *core.Policy) {
		if o != nil {
			w.Observer = func(e core.Event) {
				o.Observe(Event{Kind: EventKind(e.Kind), Err: e.Err, Wait: e.Wait, Hold: e.Hold, Context: e.Ctx, Units: e.Units})
			}
		}
	})
}

// WithLeakDetection gives back (and reports, EventLeaked) the capacity of a
// Slot found dropped while held, at two allocations per admission. Not in
// synctest bubbles that wait: the runtime runs cleanups outside them.
func WithLeakDetection() Option {
	return optionFunc(func(w *core.Policy) { w.LeakCheck = true })
}

// WithLeakSites also names where a leaked slot was acquired (~1 µs each).
func WithLeakSites() Option {
	return optionFunc(func(w *core.Policy) { w.LeakCheck, w.LeakSites = true, true })
}
