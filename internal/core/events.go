package core

import (
	"context"
	"time"
)

// EventKind is what happened to an admission; slots.EventKind takes its
// values from these.
type EventKind uint8

// The kinds of Event, as package slots documents them.
const (
	EventAcquired EventKind = iota + 1
	EventRejected
	EventBypassed
	EventReleased
	EventDoubleRelease
	EventLeaked
)

// Event is one thing that happened to an admission (see slots.Event).
type Event struct {
	Kind EventKind
	Err  error
	Wait time.Duration
	Hold time.Duration
	Ctx  context.Context // the admission's; nil for calls without one and for releases
	// Units is what the admission weighs (EventAcquired, EventBypassed,
	// EventReleased, EventLeaked); 0 for the other kinds.
	Units int
}

// Rejection is a rejection with the numbers behind it. Its fields are
// those of slots.LimitError, in the same order, so that a *Rejection
// converts to a *slots.LimitError.
type Rejection struct {
	Err        error
	Key        string
	Cap        string
	InFlight   int
	Limit      int
	Queued     int
	RetryAfter time.Duration
}
