package slots

import (
	"context"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// EventKind says what happened to an admission.
type EventKind uint8

const (
	// EventAcquired: a slot was admitted; Wait is how long the caller
	// queued for it (0 when it got in at once).
	EventAcquired = EventKind(core.EventAcquired)
	// EventRejected: no slot; Err says why (ErrLimitReached, ErrQueueFull,
	// ErrWaitTimeout, or the context's error for a caller that gave up),
	// after waiting Wait.
	EventRejected = EventKind(core.EventRejected)
	// EventBypassed: fail-open let the caller through without a slot after
	// waiting Wait.
	EventBypassed = EventKind(core.EventBypassed)
	// EventReleased: a slot's capacity came back after Hold.
	EventReleased = EventKind(core.EventReleased)
	// EventDoubleRelease: Release was called on a slot already released.
	EventDoubleRelease = EventKind(core.EventDoubleRelease)
	// EventLeaked: a slot was dropped without Release and reclaimed (with
	// leak detection on); its EventReleased came just before, with Hold.
	EventLeaked = EventKind(core.EventLeaked)
)

// Event is one thing that happened to an admission, for metrics and
// traces. It names no key: metrics built from it have no per-key labels.
type Event struct {
	Kind EventKind
	Err  error         // EventRejected
	Wait time.Duration // EventAcquired, EventBypassed, EventRejected
	Hold time.Duration // EventReleased, EventLeaked; accurate to about 10 ms on the real clock
	// Units is what the admission weighs (see Limiter.AcquireN): 1 unless
	// it took more; on EventAcquired, EventBypassed, EventReleased and
	// EventLeaked, 0 on the others.
	Units int

	// Context is the context the caller passed to Acquire (or
	// AcquireAll), on the admission's EventAcquired, EventBypassed or
	// EventRejected; nil for TryAcquire and for the other kinds. An
	// Observer may read from it (the trace span it carries, its
	// priority and flow) while Observe runs, and must not keep it.
	Context context.Context
}

// An Observer receives Events from a Limiter or a Registry. Observe is
// called without any lock held, possibly from many goroutines at once, on
// the admission path: it must be quick and must not block. An admission
// whose grant is given back because its caller's context ended reports
// EventRejected only, so acquired and released events stay paired.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f.
func (f ObserverFunc) Observe(e Event) { f(e) }
