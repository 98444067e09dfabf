// Package slots caps how many operations are in flight at once, with
// RAII-style handles.
//
// A Limiter is one pool of capacity. Acquire blocks until a Slot is free (in
// arrival order), TryAcquire never waits. Each admission returns a *Slot that
// holds one unit of capacity until it is released:
//
//	s, err := lim.Acquire(ctx)
//	if err != nil {
//		return err // *LimitError, or the context's error
//	}
//	defer s.Release()
//
// A Slot must not be copied; always pass *Slot. Release may be called from any
// goroutine; calls after the first do nothing and report false (they are
// counted as misuse in Stats, never turned into extra capacity). Time never
// frees a slot: a Slot held for an hour still counts against the limit.
//
// Rejections are *LimitError values that wrap one of ErrLimitReached,
// ErrQueueFull or ErrWaitTimeout, so errors.Is works; they carry the counts
// at the moment of the decision and a RetryAfter estimate for an HTTP layer.
// A context that ends while waiting yields an error that wraps the context's
// error.
//
// # Who goes next
//
// Every queue of the module (the Limiter's, each registry key's, the pacing
// Gate's) serves its waiters by one rule. A caller's context may carry a
// priority class (WithPriority: interactive, default or batch) and a flow
// (WithFlow, WithFlowWeight: an org, an API key). When capacity frees:
//
//  1. Among the classes whose waiters may take it (below), the highest goes
//     first.
//  2. Within a class, the flows with waiters take turns, weight grants per
//     turn (deficit round robin); a flow that arrives joins the end of the
//     round.
//  3. Within a flow, arrival order.
//
// A caller without a class or a flow is in the default class and the flow
// "", so with neither the queue is plain FIFO, at the cost of plain FIFO;
// choosing the next waiter costs the same with one flow queued or with a
// hundred thousand.
//
// Without shares, classes are strict: batch waits while any interactive or
// default caller waits. WithShare gives a class a guaranteed part of the
// limit. Each class c has a guarantee g(c) = max(Min, Reserved), met from the
// highest class down (a lower class gets what the limit leaves). A class
// may take a free slot only if that leaves free what the higher classes are
// owed and, unless it holds less than its own guarantee, what the lower
// classes are owed too; a class is owed what it holds short of g(c) while it
// has waiters, and short of Reserved while it has none. So:
//
//   - A class that holds less than its guarantee and waits gets the next
//     free slot that no higher class is owed, ahead of higher classes. A
//     class with Min m >= 1 therefore always has m slots working while it
//     waits: under any load of higher classes, each release of one of its own
//     slots passes that slot straight to its next waiter, and with holds of
//     equal length it gets m of every limit grants (1 in 4 for Min 1 of 4).
//   - A Reserved part is not lent: other classes leave it free even when its
//     class is idle, except a higher class that holds less than its own
//     guarantee.
//   - Idle Min is lent to whoever waits and is won back as lent slots are
//     released; no holder is ever evicted.
//
// Bound: a waiter that is k-th in its flow, in a class whose queued flows
// weigh W together (the sum of their weights, counting those that join
// while it waits) and whose own flow weighs w, is served within
// ceil(k/w)*(W-w) + k grants of its class: each turn of its flow is
// preceded by at most one turn of every other flow. (The head of a weight-1
// flow behind one other weight-1 flow: within 2 grants.) Grants of its class
// come at least at every release of the class's own slots once it holds its
// Min, or at every grant while it holds less; with Min 0 a lower class can
// wait as long as higher classes keep waiting. The bound is exact for a
// Limiter and for a registry key whose waiters need that key alone; where a
// waiter cannot be served yet (another key of an AcquireAll is full, a
// model of a Gate is not due) the ones after it are served meanwhile; an
// AcquireAll is passed over that way at most registry.MaxPassed times.
//
// WithMaxQueuePerFlow bounds one flow's waiters apart from the whole queue.
// Limiter.Queue (and Registry.Queue, Gate.Status) report the waiters per
// class and the flows with the most waiters. PlaceFromHeaders reads the
// class and the flow from request headers.
//
// For caps per key (per tenant, per model) see package registry, which hands
// out the same *Slot.
package slots

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// Unlimited is a limit that never binds.
const Unlimited = math.MaxInt

var (
	// ErrLimitReached: TryAcquire found no free capacity.
	ErrLimitReached = errors.New("slots: limit reached")
	// ErrQueueFull: more callers were already waiting than the queue allows;
	// the newest is rejected at once.
	ErrQueueFull = errors.New("slots: queue full")
	// ErrWaitTimeout: the maximum wait passed without admission (fail-closed).
	ErrWaitTimeout = errors.New("slots: wait timeout")
	// ErrNilContext: Acquire was called with a nil context.
	ErrNilContext = errors.New("slots: nil context")
)

// LimitError is a rejection with the numbers behind it.
type LimitError struct {
	Err        error         // ErrLimitReached, ErrQueueFull, ErrWaitTimeout or another package's reason
	Key        string        // the key that was at its limit; empty for a Limiter
	InFlight   int           // holders at the decision
	Limit      int           // the limit at the decision
	Queued     int           // waiters at the decision
	RetryAfter time.Duration // estimate of when to try again; at least one second
}

func (e *LimitError) Error() string {
	var key string
	if e.Key != "" {
		key = fmt.Sprintf("key %q: ", e.Key)
	}
	limit := fmt.Sprint(e.Limit)
	if e.Limit == Unlimited {
		limit = "unlimited"
	}
	return fmt.Sprintf("%v (%s%d in flight, limit %s, %d queued; retry after %v)",
		e.Err, key, e.InFlight, limit, e.Queued, e.RetryAfter)
}

func (e *LimitError) Unwrap() error { return e.Err }

// Slot is one admission: it holds one unit of capacity (of every key it was
// admitted under) until Release. The zero value and a nil *Slot hold nothing;
// their methods are no-ops. A Slot must not be copied (go vet's copylocks
// check reports copies); pass *Slot.
//
// Its fields belong to the package that admitted it: a Slot is declared
// over the record that every admission of this module fills in.
type Slot core.Handle

// hold returns the record of the admission inside s.
func (s *Slot) hold() *core.Hold { return (*core.Handle)(s).Hold() }

// tracked reports whether s stands in for a hold kept apart from it
// (leak detection); such a Slot must not be kept reachable by the library.
func (s *Slot) tracked() bool {
	_, ok := s.hold().Owner.(*core.Tracked)
	return ok
}

// holds reports whether s came from an admission.
func (s *Slot) holds() bool { return s != nil && s.hold().Owner != nil }

// Release frees the slot's capacity. It is safe to call from any goroutine and
// any number of times; it reports true only for the call that freed it.
func (s *Slot) Release() bool {
	if !s.holds() {
		return false
	}
	ok := s.hold().Release()
	// With leak detection, s must stay reachable until its cleanup has been
	// stopped, or a collection midway would report a leak that is not one.
	runtime.KeepAlive(s)
	return ok
}

// releaseQuietly frees the slot if it is still held, without counting a
// repeat as misuse; for the HTTP seams, where a body's EOF, its Close and
// its request's end may each be the last.
func (s *Slot) releaseQuietly() {
	if s.holds() {
		s.hold().ReleaseQuietly()
		runtime.KeepAlive(s) // see Release
	}
}

// Released reports whether Release has been called (or, for a slot whose
// holder's context ended as it was granted, whether it was given back).
func (s *Slot) Released() bool {
	if !s.holds() {
		return true
	}
	return s.hold().Released()
}

// Bypassed reports whether the slot was admitted by fail-open after the
// maximum wait: it holds no capacity, and the limit was saturated.
func (s *Slot) Bypassed() bool { return s.holds() && s.hold().Bypassed }

// Degraded reports whether the slot was admitted without its fleet-wide
// cap, because the store that keeps that cap could not be reached (see
// package registry/fleet): it holds only this process's local cap, or, if it
// is also Bypassed, nothing.
func (s *Slot) Degraded() bool { return s.holds() && s.hold().Degraded }

// AcquiredAt returns when the slot was admitted (granted, for a caller that
// waited), on the owner's clock. On the real clock it is accurate to about
// 10 ms: admissions share a coarse clock reading, since reading the clock
// costs about as much as the rest of an admission.
func (s *Slot) AcquiredAt() time.Time {
	if !s.holds() {
		return time.Time{}
	}
	return s.hold().Owner.Time(s.hold().At)
}

// ID returns the slot's holder id, unique within its Limiter or Registry; it
// is what leak and long-held reports name.
func (s *Slot) ID() uint64 {
	if !s.holds() {
		return 0
	}
	return s.hold().ID
}
