package core

import (
	"cmp"
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/clockx"
)

// Engine is the admission machinery that every owner of lanes runs (the
// Limiter, the Registry, the pacing Gate, and through its local Registry a
// fleet Registry): the wait policy, making and handing out Slots, the
// wait, rejections, fail-open, releases, misuse and leaks, and the events
// and logs of each. An owner keeps its lanes and its lock and decides under
// that lock; the Engine does everything around the decision, the same way
// for all of them.
//
// Set Policy and call Init before use; the methods may then be called from
// any goroutine, without the owner's lock unless they say otherwise.
type Engine struct {
	Policy
	Clock *clockx.Clock
	name  string // the owner's package, in errors and logs
	// SampleShift is how many low bits of a hold's ID are not its owner's
	// sequence number (a Registry's shard index): sampling skips them.
	SampleShift uint
	// asError turns a rejection into the owner's error (a
	// *slots.LimitError).
	asError func(*Rejection) error

	// Written now and then; kept off the cache line of the read-mostly
	// fields above, which every admission on every core reads.
	_       [64]byte
	hold    HoldTime
	satLog  Every
	misuses atomic.Uint64
	leaks   atomic.Uint64
}

// saturationLogEvery spaces the fail-open saturation warnings.
const saturationLogEvery = 10 * time.Second

// Init readies e for an owner of package name ("slots", "registry",
// "pacing"), after its Policy has been set, with asError making the
// owner's error of a rejection.
func (e *Engine) Init(name string, asError func(*Rejection) error) {
	e.name, e.asError = name, asError
	e.Clock = clockx.New(e.Policy.Clock)
}

// Emit hands ev to the Observer, if it wants it. Call without locks.
func (e *Engine) Emit(ev Event) {
	if e.observes(ev.Ctx) {
		e.Observer(ev)
	}
}

// observes reports whether the Observer wants an Event under ctx.
func (e *Engine) observes(ctx context.Context) bool {
	return e.Observer != nil && (e.Wants == nil || e.Wants(ctx))
}

// Full reports whether a caller of flow must be turned away from q instead
// of queued, by the queue bound and the per-flow bound. Call under the
// owner's lock.
func (e *Engine) Full(q *Queue, flow string) bool {
	return e.QueueFull(q.Len()) || e.BoundFlowQueue && q.FlowLen(flow) >= e.MaxFlowQueue
}

// Reject builds the rejection for reason with the counts at the decision
// (call under the owner's lock) and a Retry-After estimated from them (see
// HoldTime.RetryAfter). Report it with Rejected once the lock is released.
func (e *Engine) Reject(reason error, key string, inFlight, limit, queued int) *Rejection {
	return e.rejectAt(reason, key, inFlight, limit, queued, limit, 1, Uncounted, queued+1, nil, 0, nil)
}

// RejectLane builds the rejection for reason of a caller of ln (class c, n
// units), with ln's counts and a Retry-After from when its holders started,
// spread from those told to the others refused on it: a caller heavier
// than ln can ever hold (ErrExceedsLimit) is told no Retry-After, since
// coming back cannot help; one that timed out (ErrWaitTimeout) is told to
// come back before its room frees, by half its wait (see RejectLaneTurns).
func (e *Engine) RejectLane(reason error, key string, ln *Lane, n int, c uint8) *Rejection {
	return e.RejectLaneTurns(reason, key, ln, n, c, ln.Limit, e.MaxWait)
}

// RejectLaneTurns is RejectLane whose Retry-After counts turns of slots
// units, where a tighter cap than ln's limit binds (its holders' ends and
// free units left out). One that timed out counts only the waiters of
// higher classes ahead (those of its class and lower came after it, and are
// served or told after it; none if its class is owed its share), and is
// told to come back half of wait (what it may spend queued again, at most
// half a turn) before its room frees. Returns are booked in the order ln's
// units free too (Told).
func (e *Engine) RejectLaneTurns(reason error, key string, ln *Lane, n int, c uint8, slots int, wait time.Duration) *Rejection {
	var buf [EndsScan]End
	var ends []End
	need := n + ln.Waiters.Units()
	if reason != ErrWaitTimeout {
		wait = 0
	} else if need = n; !ln.Short(c) { // else its class is owed its share, and goes first
		for _, o := range Order[:rank[c]] { // the classes served before it
			need += ln.Waiters.ClassUnits(o)
		}
	}
	if free := ln.Free(); slots == ln.Limit && need > free {
		// Room binds: the holders' ends free what it lacks. Otherwise
		// (shares, or a Gate's tokens, budgets, pacing) the free units
		// are not this caller's: turns of the whole lane.
		ends, need = ln.Holders.Ends(buf[:0], (*Hold).Units, ln.Holders.Units()), need-free
	}
	if ln.Told == nil {
		ln.Told = new(Told)
	}
	if slots != ln.Limit || reason == ErrWaitTimeout && ln.Short(c) {
		c = Uncounted // its turns are a tighter cap's, or its class goes first
	}
	return e.rejectAt(reason, key, ln.Holders.Units(), ln.Limit, ln.Waiters.Len(), slots, n, c, need, ends, wait, ln.Told)
}

func (e *Engine) rejectAt(reason error, key string, inFlight, limit, queued, slots, n int, c uint8, need int, ends []End, wait time.Duration, told *Told) *Rejection {
	rej := &Rejection{Err: reason, Key: key, InFlight: inFlight, Limit: limit, Queued: queued}
	if reason == ErrExceedsLimit {
		return rej // coming back cannot help: no Retry-After, and none booked
	}
	lead := wait / 2
	if slots > 0 { // half a turn, of a second's hold before one is known
		lead = min(lead, time.Duration(cmp.Or(e.hold.ewma.Load(), int64(time.Second))/int64(slots)/2))
	}
	rej.RetryAfter = e.hold.retryAfter(e.Clock.Coarse(), n, c, need, slots, ends, lead, told)
	return rej
}

// Waiter is NewWaiter for h under the Policy's MaxWait, come now by an
// exact reading (h.At may be coarse): its wait is timed on exact readings,
// so that it is told (Event.Wait) within the caller's own span of time.
func (e *Engine) Waiter(h *Hold) *Waiter {
	w := NewWaiter(h, e.MaxWait)
	w.Start = e.Clock.Nanos()
	return w
}

// HoldTime returns the estimate of how long holders keep their capacity,
// for a Retry-After on a cap of the owner's own (see HoldTime.RetryAfter).
func (e *Engine) HoldTime() *HoldTime { return &e.hold }

// Rejected reports a rejection for reason of a caller that waited wait,
// under ctx (nil: a call without a context); call without locks.
func (e *Engine) Rejected(ctx context.Context, reason error, wait time.Duration) {
	e.Emit(Event{Kind: EventRejected, Err: reason, Wait: wait, Ctx: ctx})
}

// Released samples h's hold time for Retry-After and reports the release.
// A grant given back (its caller's context ended as it came) was held for
// no time: it is neither sampled nor reported. Call without locks, once
// h's capacity has been freed.
//
// A sample's duration ends on an exact reading: h.At may be exact (the
// Gate's) or a coarse one, which is never later than the time it stands
// for, so it is never negative. The event's ends on a coarse one, as
// admissions start on one (an exact reading costs as much as the rest of
// an observed release on some machines: BenchmarkAdmission in
// sweep/inflightotel), and is 0 rather than negative when an exact start
// is ahead of it.
func (e *Engine) Released(h *Hold) {
	if h.GivenBack {
		return
	}
	if Sampled(h.ID>>e.SampleShift) || e.hold.Warming() {
		e.hold.Observe(e.Clock.Nanos() - h.At)
	}
	if e.observes(nil) {
		e.Observer(Event{Kind: EventReleased, Hold: time.Duration(max(e.Clock.Coarse()-h.At, 0)), Units: h.Units()})
	}
}

// Misuse counts and reports a Release of a slot already released, or of a
// copy of a Slot: it frees nothing.
func (e *Engine) Misuse(h *Hold) {
	e.misuses.Add(1)
	e.Emit(Event{Kind: EventDoubleRelease})
	e.Log().Debug(e.name+": slot released twice", slog.Uint64("slot_id", h.ID))
}

// Misuses returns the number of Misuse calls.
func (e *Engine) Misuses() uint64 { return e.misuses.Load() }

// Reclaim frees a dropped Slot's hold t, if it is still held, and reports
// the leak, with attrs naming what it held (a Registry's key). The owner
// reads them before, while t still counts.
func (e *Engine) Reclaim(t *Tracked, attrs ...slog.Attr) {
	if !t.released.CompareAndSwap(false, true) {
		return
	}
	// Counted and reported before the release, whose Observer may panic.
	held := time.Duration(e.Clock.Nanos() - t.At)
	e.leaks.Add(1)
	attrs = append(attrs, slog.Uint64("slot_id", t.ID), slog.Duration("held_for", held.Round(time.Millisecond)))
	if site := t.callSite(); site != "" {
		attrs = append(attrs, slog.String("acquired_at", site))
	}
	defer e.Emit(Event{Kind: EventLeaked, Hold: held, Units: t.Units()})
	defer t.Owner.Release(&t.Hold) // also if the logger panics
	e.Log().LogAttrs(context.Background(), slog.LevelWarn, e.name+": slot dropped without Release; capacity reclaimed", attrs...)
}

// Leaks returns the number of leaks reclaimed.
func (e *Engine) Leaks() uint64 { return e.leaks.Load() }
