package core

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
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
// "pacing"), after its Policy has been set.
func (e *Engine) Init(name string) {
	e.name = name
	e.Clock = clockx.New(e.Policy.Clock)
}

// Emit hands ev to the Observer, if there is one. Call without locks.
func (e *Engine) Emit(ev Event) {
	if e.Observer != nil {
		e.Observer(ev)
	}
}

// NewSlot returns a new Slot's record and the hold to admit for it, owned
// by owner: the record's own hold or, with leak detection, a tracked one
// apart from it (see Tracked), which HandOut then attaches. skip is the
// number of frames between the caller and the user's code (0 when the
// caller is what the user called), for leak sites.
func (e *Engine) NewSlot(owner Owner, skip int) (*Handle, *Hold, *Tracked) {
	if e.LeakCheck {
		return e.newTracked(owner, skip+1)
	}
	x := new(Handle)
	x.h.Owner = owner
	return x, &x.h, nil
}

// newTracked is NewSlot with leak detection.
func (e *Engine) newTracked(owner Owner, skip int) (*Handle, *Hold, *Tracked) {
	t := new(Tracked)
	t.Owner = owner
	if e.LeakSites {
		t.RecordSite(skip + 2) // above newTracked, its caller and skip more
	}
	return new(Handle), &t.Hold, t
}

// HandOut finishes an admission without reporting it (a bypass): with leak
// detection, x becomes the stand-in of its tracked hold t.
func (e *Engine) HandOut(x *Handle, t *Tracked) *Handle {
	if t != nil {
		AttachTo(t, x, &x.h)
	}
	return x
}

// Acquired hands out an admitted Slot and reports it after waiting wait,
// under ctx (nil: an admission without a context). If the Observer panics
// the Slot is released, since it never reaches its caller, and the panic
// goes on up.
func (e *Engine) Acquired(ctx context.Context, x *Handle, t *Tracked, wait time.Duration) *Handle {
	if t == nil && e.Observer == nil {
		return x // small enough to inline: the common admission
	}
	return e.acquiredSlow(ctx, x, t, wait)
}

func (e *Engine) acquiredSlow(ctx context.Context, x *Handle, t *Tracked, wait time.Duration) *Handle {
	e.HandOut(x, t)
	if e.Observer != nil {
		ok := false
		defer func() {
			if !ok {
				x.h.Release()
				runtime.KeepAlive(x) // see Tracked
			}
		}()
		e.Observer(Event{Kind: EventAcquired, Wait: wait, Ctx: ctx, Units: x.h.Units()})
		ok = true
	}
	return x
}

// Full reports whether a caller of flow must be turned away from q instead
// of queued, by the queue bound and the per-flow bound. A nil q is empty.
// Call under the owner's lock.
func (e *Engine) Full(q *Queue, flow string) bool {
	if q == nil {
		return e.QueueFull(0) || e.FlowQueueFull(0)
	}
	return e.QueueFull(q.Len()) || e.BoundFlowQueue && e.FlowQueueFull(q.FlowLen(flow))
}

// Reject builds the rejection for reason with the counts at the decision
// (call under the owner's lock) and a Retry-After estimated from them (see
// HoldTime.RetryAfter). Report it with Rejected once the lock is released.
func (e *Engine) Reject(reason error, key string, inFlight, limit, queued int) *Rejection {
	return e.rejectAt(reason, key, inFlight, limit, queued, limit, nil, 0, nil)
}

// RejectLane is Reject with ln's counts, and a Retry-After from when its
// holders started, spread from those told to the others refused on it.
func (e *Engine) RejectLane(reason error, key string, ln *Lane) *Rejection {
	return e.RejectLaneTurns(reason, key, ln, ln.Limit, 0)
}

// RejectLaneTurns is RejectLane whose Retry-After counts turns of slots
// slots, where a tighter cap than ln's limit binds, and tells the caller to
// come back before its slot frees, by half of wait (at most half a turn):
// pass the wait it may spend queued on its return (one that timed out in
// the queue), 0 for one that cannot queue.
func (e *Engine) RejectLaneTurns(reason error, key string, ln *Lane, slots int, wait time.Duration) *Rejection {
	var buf [startsScan]int64
	var starts []int64
	if slots == ln.Limit && ln.Holders.Units() >= slots { // full: its holders' ends free the slots
		starts = ln.Holders.Starts(buf[:0])
	}
	if ln.Told == nil {
		ln.Told = new(Told)
	}
	return e.rejectAt(reason, key, ln.Holders.Units(), ln.Limit, ln.Waiters.Len(), slots, starts, wait, ln.Told)
}

func (e *Engine) rejectAt(reason error, key string, inFlight, limit, queued, slots int, starts []int64, wait time.Duration, told *Told) *Rejection {
	lead := wait / 2
	if slots > 0 {
		lead = min(lead, time.Duration(e.hold.ewma.Load()/int64(slots)/2))
	}
	return &Rejection{Err: reason, Key: key, InFlight: inFlight, Limit: limit, Queued: queued,
		RetryAfter: e.hold.RetryAfter(e.Clock.Coarse(), queued, slots, starts, lead, told)}
}

// Rejected reports a rejection for reason of a caller that waited wait,
// under ctx (nil: a call without a context); call without locks.
func (e *Engine) Rejected(ctx context.Context, reason error, wait time.Duration) {
	if e.Observer != nil {
		e.Observer(Event{Kind: EventRejected, Err: reason, Wait: wait, Ctx: ctx})
	}
}

// Canceled reports a caller whose context ended before it was admitted,
// after waiting wait, and returns its error. Call without locks.
func (e *Engine) Canceled(ctx context.Context, wait time.Duration) error {
	e.Rejected(ctx, ctx.Err(), wait)
	return fmt.Errorf("%s: acquire: %w", e.name, ctx.Err())
}

// Since is how long ago start (a clock reading of e's) was, for the wait
// of a caller turned away.
func (e *Engine) Since(start int64) time.Duration { return time.Duration(e.Clock.Nanos() - start) }

// Wait blocks until w is granted, ctx ends or maxWait passes (<= 0: no
// bound); see Await.
func (e *Engine) Wait(ctx context.Context, w *Waiter, maxWait time.Duration, withdraw func(*Waiter) bool) Outcome {
	var expire <-chan time.Time
	if maxWait > 0 {
		c, stop := e.Clock.Timer(maxWait)
		defer stop()
		expire = c
	}
	return Await(ctx, w, expire, withdraw)
}

// Bypass admits h by fail-open after its wait of at most maxWait, which
// began at start: it holds no capacity. The saturation of what ("limiter",
// "key", "provider") is logged at most once every 10 seconds, with attrs,
// and reported. Call without locks, after the owner has counted the bypass
// (and given h an ID, if its owner numbers bypasses).
func (e *Engine) Bypass(ctx context.Context, h *Hold, start int64, maxWait time.Duration, what string, attrs ...slog.Attr) {
	Bypass(h)
	h.At = e.Clock.Nanos() // exact: start may be an exact reading too
	if e.satLog.Allow(h.At, saturationLogEvery) {
		if h.ID != 0 {
			attrs = append(attrs, slog.Uint64("slot_id", h.ID))
		}
		attrs = append(attrs, slog.Duration("max_wait", maxWait))
		e.Log().LogAttrs(context.Background(), slog.LevelWarn,
			e.name+": "+what+" saturated; admitting without a slot (fail-open)", attrs...)
	}
	e.Emit(Event{Kind: EventBypassed, Wait: time.Duration(h.At - start), Ctx: ctx, Units: h.Units()})
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
	if h.ID&SampleMask == 0 || e.hold.Warming() {
		e.hold.Observe(e.Clock.Nanos() - h.At)
	}
	if e.Observer != nil {
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
	if !t.ReleaseQuietly() {
		return
	}
	held := time.Duration(e.Clock.Nanos() - t.At)
	e.leaks.Add(1)
	attrs = append(attrs, slog.Uint64("slot_id", t.ID), slog.Duration("held_for", held.Round(time.Millisecond)))
	if site := t.Site(); site != "" {
		attrs = append(attrs, slog.String("acquired_at", site))
	}
	e.Log().LogAttrs(context.Background(), slog.LevelWarn, e.name+": slot dropped without Release; capacity reclaimed", attrs...)
	e.Emit(Event{Kind: EventLeaked, Hold: held, Units: t.Units()})
}

// Leaks returns the number of leaks reclaimed.
func (e *Engine) Leaks() uint64 { return e.leaks.Load() }
