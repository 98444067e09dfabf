package core

import (
	"context"
	"time"

	"github.com/inflight-go/inflight/internal/ilist"
)

// Waiter states; guarded by the owner's lock.
const (
	Waiting uint8 = iota
	Granted
	Gone    // cancelled or timed out before a grant
	Refused // turned away by its owner while it waited (Wakes.Refuse)
)

// Waiter is one caller blocked in Acquire.
type Waiter struct {
	// ready (buffered 1) carries the grant. A channel, not a WaitGroup or a
	// Cond: a grant may come from a goroutine inside a testing/synctest
	// bubble for a waiter outside it, which a channel allows and a
	// WaitGroup turns into a fatal error.
	ready chan struct{}

	State uint8
	Class uint8 // the hold's class, copied here for the queue
	Hold  *Hold // the caller's hold; counted by its lane(s) once granted
	Seq   uint64
	// Start is when the caller came (Engine.Waiter: an exact reading);
	// MaxWait is how long it may wait (<= 0: until its context ends).
	Start   int64
	MaxWait time.Duration
	ends    Waits // how its wait ends (Wait)
	// Flow and Weight place the waiter among the flows of its class; Cost
	// is what its grant charges its flow's turn (NewWaiter: its units).
	Flow   string
	Weight int32
	Cost   int32
	Passed int64 // units granted past it while its own did not fit (Pass)

	// Elem links the waiter into its lane's Waiters.
	Elem ilist.Elem[*Waiter]
}

// Pass counts n units of w2, granted past w (Lane.Candidate; a nil w is
// none); another flow's or class's count 2*PassFactor-fold, so that they
// take about half of w's units past it (the last may take more) and flows
// keep their shares.
func (w *Waiter) Pass(w2 *Waiter, n int64) {
	if w == nil {
		return
	}
	if w2.Flow != w.Flow || w2.Class != w.Class {
		n *= 2 * PassFactor
	}
	w.Passed += n
}

// NewWaiter returns a waiter for h in state Waiting, which came at h.At
// (Engine.Waiter: an exact reading) and may wait maxWait. Waiters are not
// pooled: a channel belongs to the testing/synctest bubble that made it,
// and a pooled one would cross from one test's bubble into another.
func NewWaiter(h *Hold, maxWait time.Duration) *Waiter {
	w := &Waiter{ready: make(chan struct{}, 1), Hold: h, Class: h.Class, Start: h.At, MaxWait: maxWait, Cost: h.Extra + 1}
	w.Elem.Value = w
	return w
}

func (w *Waiter) wake() { w.ready <- struct{}{} }

// Wakes collects the waiters granted under an owner's lock, to be woken once
// the lock is released: a goroutine woken under the lock would first contend
// for it. The zero value is empty; keep it on the stack.
type Wakes struct {
	n    int
	ws   [4]*Waiter
	more []*Waiter
}

// Grant marks w granted; call under the owner's lock, after w's hold has
// been counted. w is woken by Wake.
func (k *Wakes) Grant(w *Waiter) {
	w.State = Granted
	if k.n < len(k.ws) {
		k.ws[k.n] = w
		k.n++
		return
	}
	k.more = append(k.more, w)
}

// Refuse marks w refused by its owner (it weighs more than its lane can
// ever admit now, Lane.Capacity; or its owner closed). Call under the
// owner's lock, after unlinking w from every queue it was on; w is woken
// by Wake and its wait ends with OutRefused.
func (k *Wakes) Refuse(w *Waiter) {
	k.Grant(w)
	w.State = Refused
}

// Wake wakes the granted (and refused) waiters; call after releasing the
// owner's lock.
// A waiter whose context ended meanwhile finds State == Granted and waits for
// this signal before giving the grant back.
func (k *Wakes) Wake() {
	if k.n == 0 {
		return
	}
	for _, w := range k.ws[:k.n] {
		w.wake()
	}
	for _, w := range k.more {
		w.wake()
	}
}

// Outcome is how a wait ended.
type Outcome uint8

const (
	OutGranted  Outcome = iota // the caller holds capacity
	OutCanceled                // ctx ended first; the caller holds nothing
	OutExpired                 // the max wait passed first; the caller holds nothing
	OutRefused                 // the owner refused it (Wakes.Refuse); the caller holds nothing
	// OutDeadline is OutCanceled by the context's deadline (Finish tells
	// the two apart): a server's, whose client may come back, so its owner
	// says when (Waits.Ended).
	OutDeadline
)

// Await blocks until w is granted, ctx ends or expire fires (nil: never).
// withdraw must, under the owner's lock, unlink w if it is still Waiting, mark
// it Gone and report true; it reports false when w was granted already
// (Waits.Withdraw).
//
// A caller whose context has ended never leaves with capacity: a grant that
// races ctx's end is given back (released, so the capacity passes to the next
// waiter) and the outcome is OutCanceled, whichever case select saw first. A
// grant that races expiry alone is kept: the caller asked to wait that long
// and got in.
func Await(ctx context.Context, w *Waiter, expire <-chan time.Time, withdraw func(*Waiter) bool) Outcome {
	done := ctx.Done()
	if done == nil && expire == nil {
		<-w.ready // nothing else can end this wait; a plain receive is cheaper
	} else {
		select {
		case <-w.ready:
		case <-done:
			if withdraw(w) {
				return OutCanceled
			}
			<-w.ready
		case <-expire:
			if withdraw(w) {
				if isDone(done) {
					return OutCanceled
				}
				return OutExpired
			}
			<-w.ready
		}
	}
	// Set under the owner's lock before the wake this goroutine received.
	if w.State == Refused {
		return OutRefused
	}
	if isDone(done) {
		w.Hold.GivenBack = true
		w.Hold.Release()
		return OutCanceled
	}
	return OutGranted
}

// Ended reports whether ctx (nil: a call that does not wait) has ended.
// Admissions ask it under their owner's lock, as the last check before
// they decide: asked before, a context that ends and a slot that frees in
// between would admit a caller that has given up.
func Ended(ctx context.Context) bool { return ctx != nil && isDone(ctx.Done()) }

func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Place is where a caller queues: its class, and its flow within the class
// with the flow's weight. The zero Place is the default class's default
// flow.
type Place struct {
	Class  uint8
	Flow   string
	Weight int32
}

type placeKey struct{}

// WithPlace returns a copy of ctx carrying p.
func WithPlace(ctx context.Context, p Place) context.Context {
	return context.WithValue(ctx, placeKey{}, p)
}

// PlaceOf returns the Place ctx carries, or the zero Place.
func PlaceOf(ctx context.Context) Place {
	p, _ := ctx.Value(placeKey{}).(Place)
	return p
}

// Place sets w's flow and weight (its class comes from its hold); call
// before w is queued.
func (w *Waiter) Place(p Place) {
	w.Flow, w.Weight = p.Flow, p.Weight
}
