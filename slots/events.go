package slots

import (
	"context"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// EventKind says what happened to an admission.
type EventKind uint8

const (
	EventAcquired      = EventKind(core.EventAcquired)      // admitted after Wait
	EventRejected      = EventKind(core.EventRejected)      // refused after Wait; Err says why
	EventBypassed      = EventKind(core.EventBypassed)      // fail-open, after Wait
	EventReleased      = EventKind(core.EventReleased)      // capacity back after Hold
	EventDoubleRelease = EventKind(core.EventDoubleRelease) // Release of a released slot
	EventLeaked        = EventKind(core.EventLeaked)        // reclaimed by leak detection, after its EventReleased
)

// Event is one thing that happened to an admission. It names no key.
type Event struct {
	Kind    EventKind
	Err     error           // EventRejected
	Wait    time.Duration   // EventAcquired, EventBypassed, EventRejected
	Hold    time.Duration   // EventReleased, EventLeaked; to about 10 ms
	Units   int             // what it weighs; 0 on EventRejected and EventDoubleRelease
	Context context.Context // Acquire's, on its outcome; read it in Observe only
}

// An Observer receives Events on the admission path, with no lock held and
// possibly concurrently: it must be quick. One with Enabled(ctx) bool is
// asked first, as a slog.Handler is (ctx nil for Events without one), and
// what it declines is not built. Otherwise admissions pair with releases.
// A panic in it goes up, or is logged on the library's goroutines (timers).
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f.
func (f ObserverFunc) Observe(e Event) { f(e) }
