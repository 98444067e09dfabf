package slots

import (
	"context"
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
)

// An Option configures a Limiter or a registry.Registry; nil ones are ignored.
type Option interface {
	// Apply is for this module's packages; use the With functions.
	Apply(*core.Settings)
	limiter()
}

// A BaseOption is an Option that every owner takes, a pacing Gate too.
type BaseOption interface {
	Option
	base()
}

type optionFunc func(*core.Policy)

func (f optionFunc) Apply(s *core.Settings) { f(&s.Policy) }
func (optionFunc) limiter()                 {}

type baseOption struct{ optionFunc }

func (baseOption) base() {}

// A ClockOption is WithClock's; a Transport and pacing's budgets take it too.
type ClockOption interface {
	BaseOption
	TransportOption
}

type clockOption struct {
	baseOption
	c clock.Clock
}

// WithMaxWait bounds a wait (ErrWaitTimeout); d <= 0, the default: no bound.
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(w *core.Policy) { w.MaxWait = d })
}

// WithMaxQueue bounds waiters (ErrQueueFull); 0: none; unset, < 0: no cap.
func WithMaxQueue(n int) Option {
	return optionFunc(func(w *core.Policy) { w.MaxQueue, w.BoundQueue = n, n >= 0 })
}

// WithFailOpen lets a wait that reaches WithMaxWait through, Bypassed.
func WithFailOpen() Option {
	return optionFunc(func(w *core.Policy) { w.FailOpen = true })
}

// WithClock sets the clock of acquire times, waits and lingers; for tests.
func WithClock(c clock.Clock) ClockOption {
	return clockOption{baseOption{func(w *core.Policy) { w.Clock = c }}, c}
}

// WithLogger sets the warnings' logger (nil: slog.Default()).
func WithLogger(l *slog.Logger) BaseOption {
	return baseOption{func(w *core.Policy) { w.Logger = l }}
}

// WithObserver sets an Observer of admissions, refusals and releases.
func WithObserver(o Observer) BaseOption {
	return baseOption{func(w *core.Policy) {
		if o != nil {
			w.Observer = func(e core.Event) {
				o.Observe(Event{Kind: EventKind(e.Kind), Err: e.Err, Wait: e.Wait, Hold: e.Hold, Context: e.Ctx, Units: e.Units})
			}
			w.Wants = nil
			if eo, ok := o.(interface{ Enabled(context.Context) bool }); ok {
				w.Wants = eo.Enabled
			}
		}
	}}
}

// WithLeakDetection gives back (EventLeaked) a Slot dropped while held, at
// two allocations per admission; not in synctest bubbles that wait.
func WithLeakDetection() Option {
	return optionFunc(func(w *core.Policy) { w.LeakCheck = true })
}

// WithLeakSites also names where a leaked slot was acquired (~1 µs each).
func WithLeakSites() Option {
	return optionFunc(func(w *core.Policy) { w.LeakCheck, w.LeakSites = true, true })
}
