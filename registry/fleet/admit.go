package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
)

// observe reports an admission's outcome to the Observer, if there is
// one and it wants it: s admitted (or bypassed), or err, after waiting
// wait under ctx. If the Observer (or its Enabled) panics on an
// admission, s is released, since it never reaches its caller, and the
// panic goes on up.
func (r *Registry[K]) observe(ctx context.Context, s *slots.Slot, err error, wait time.Duration) {
	o := r.cfg.observer
	if o == nil {
		return
	}
	e := slots.Event{Kind: slots.EventRejected, Err: err, Wait: wait, Context: ctx}
	if err == nil {
		e.Kind, e.Units = slots.EventAcquired, s.Units()
		if s.Bypassed() {
			e.Kind = slots.EventBypassed
		}
		ok := false
		defer func() {
			if !ok {
				// The release's own event goes to the same Observer: a
				// second panic from it must not hide the first.
				func() {
					defer func() { _ = recover() }()
					s.Release()
				}()
			}
		}()
		if r.cfg.wants(ctx) {
			o.Observe(e)
		}
		ok = true
		return
	}
	if r.cfg.wants(ctx) {
		o.Observe(e)
	}
}

// wants reports whether the Observer wants an Event under ctx (nil: one
// without a context): it has no Enabled, or Enabled says so (see
// slots.Observer).
func (c *config) wants(ctx context.Context) bool {
	e, ok := c.observer.(interface{ Enabled(context.Context) bool })
	return !ok || e.Enabled(ctx)
}

// quietLocal stands in for an Observer given through WithLocalOptions
// when the fleet has one of its own (WithObserver): the local registry's
// admissions and releases are the fleet's to report.
var quietLocal = slots.ObserverFunc(func(slots.Event) {})

// outcome is one admission decision.
type outcome struct {
	slot    *slots.Slot
	err     error
	full    int           // with ErrLimitReached: the index of the full key; else -1
	retryIn time.Duration // with full or queued: until its earliest lease expires (0: unknown), or the pause ends
	paused  bool          // refused because new admissions are paused (see pause.go); full is 0
	resume  time.Time     // with paused: when the pause ends, on this process's clock
	queued  bool          // waiting in the fleet's queue; full is the index of a full key
	retry   bool          // a waiter's call timed out, the breaker closed: it asks again
	local   bool          // with full: full under the local registry (FallbackLocal, the store unreachable)
	outside bool          // with full: given back for a lease admitted outside the store (see outsideMeanwhile)
	seen    uint64        // with outside: heldLeases.wentIn as the store decided (see givenBack)
	overCut bool          // admitted over a learned cap cut meanwhile: see attempt
	// gone: the store admitted l, given back (see giveBack): its id is on
	// its way out of the store, its place in the queue with it (a waiter
	// queued as that id claimed it), nothing left to take back.
	gone bool
	// With full: that key's lease count and queue length, as the reply
	// told them.
	inFlight, queuedN int
}

func failed(err error) outcome { return outcome{err: err, full: -1} }

// tooHeavyLocked returns a *slots.LimitError wrapping
// slots.ErrExceedsLimit if a key of l has a limit (above 0, which is a
// pause) below l's units, or nil. Call it after limitsLocked.
func (r *Registry[K]) tooHeavyLocked(l *lease[K]) error {
	for i, limit := range l.limits {
		if limit > 0 && l.units > limit {
			return &slots.LimitError{Err: slots.ErrExceedsLimit, Key: l.names[i], Limit: limit}
		}
	}
	return nil
}

// limitsLocked records in l the current limits of its keys.
func (r *Registry[K]) limitsLocked(l *lease[K]) {
	l.limits = l.limits[:0]
	for _, k := range l.keys {
		l.limits = append(l.limits, r.limitLocked(k))
	}
}

// attempt makes one admission decision for l, waiting as w if not nil: in
// the store, or, when the store cannot be reached (the breaker is open, or
// this call failed; a waiter's that timed out asks again: see wait), as
// WithUnavailable says. Its call to the store is made under callCtx (ctx,
// or ctx bounded by the longest wait), and a lease admitted is recorded
// under ctx: a caller whose longest wait runs out as the store admits it
// holds the lease.
func (r *Registry[K]) attempt(ctx, callCtx context.Context, l *lease[K], w *waiter) outcome {
	o := r.attemptOnce(ctx, callCtx, l, w, false)
	if o.overCut {
		// The store admitted l over a learned cap cut while its call was
		// on its way (the upstream would refuse it): the same call again,
		// with the limits now. The store gives the lease back and serves
		// the queues under them (driver.AdmitCall, step 6), then decides
		// as for a newcomer: a waiter queues, past the queue's bounds.
		r.stats.givenBack.Add(1)
		o = r.attemptOnce(ctx, callCtx, l, w, true)
	}
	return o
}

// attemptOnce is one call of attempt. An admission over a learned cap
// cut meanwhile is an outcome with overCut; when again (it is the call
// made again), its lease is given back instead, and l refused as under
// a full key.
func (r *Registry[K]) attemptOnce(ctx, callCtx context.Context, l *lease[K], w *waiter, again bool) outcome {
	// again: l's id is in the store (the first call admitted it). Any way
	// out before the store has answered this call (or the call's abandon
	// took it) takes it back, a panic included.
	pending := again
	defer func() {
		if pending {
			r.takeBack(l)
		}
	}()
	var c acquireCall[K]
	var rp reply
	for try := 0; ; try++ {
		var err error
		c, err = r.scriptArgs(l, w)
		if err != nil {
			return failed(err)
		}
		if !r.brk.allow() {
			if pending {
				pending = false
				r.takeBack(l)
			}
			return r.unqueued(ctx, l, w)
		}
		rp = r.callOrAbandon(callCtx, l, c, w)
		// Refused as late, with nothing done: the store's clock is ahead
		// of what earlier replies told (it jumped, or a client timeout
		// longer than the call timeout let the call run on). The reply
		// told it anew: once more.
		if rp.err != nil || rp.res.Status != driver.StatusTooLate || try > 0 {
			break
		}
	}
	if rp.err == nil || rp.sent {
		pending = false // answered (its lease given back or kept), or abandoned below
	}
	res := rp.res
	if err := rp.err; errors.Is(err, driver.ErrBadReply) {
		r.takeBack(l)
		return failed(err)
	}
	if err := rp.err; err != nil {
		if rp.sent {
			// The call may still run in the store: take back what it
			// adds, and go on under a new lease id.
			r.takeBack(l)
		} else if pending {
			// Not sent: the first call's lease goes back now, before l may
			// be held (unavailable) under a new id.
			pending = false
			r.takeBack(l)
		}
		switch {
		case errors.Is(err, ErrClosed):
			return failed(ErrClosed)
		case callCtx.Err() != nil: // the caller's context or wait ended, not the store
			return failed(fmt.Errorf("fleet: acquire: %w", callCtx.Err()))
		case w != nil && !r.brk.open() && timedOut(err):
			// A waiter's call that timed out while the store still counts
			// as reachable (a slow store times calls out now and then) is
			// made again: admitted outside the store at once, the waiter
			// would take the fleet over its cap while the store is there.
			return outcome{full: -1, retry: true}
		}
		return r.unqueued(ctx, l, w) // a failure, or the breaker opened while the call was queued
	}
	if res.Status < 0 || res.Key >= len(l.keys) || c.learned && res.Status == driver.StatusAdmitted && len(res.Counts) != len(l.keys) {
		r.takeBack(l)
		return failed(fmt.Errorf("fleet: unexpected admission result %+v", res))
	}
	epoch := res.Epoch
	if r.sawEpoch(epoch) {
		r.lostData()
	}
	seen := c.wentIn + r.carriedIn(c.carried, epoch) // its own: the store counted them
	switch res.Status {
	case driver.StatusPaused:
		return r.pausedOutcome(l, w, res.Count, res.Earliest, res.Now)
	case driver.StatusQueued:
		if w != nil {
			w.queuedEpoch = epoch // its place is in this store's queue
		}
		o := outcome{queued: true, full: res.Key, inFlight: int(res.Count), queuedN: int(res.Queue)}
		if res.Earliest > res.Now {
			o.retryIn = time.Duration(res.Earliest-res.Now) * time.Millisecond
		}
		return o
	case driver.StatusFull, driver.StatusQueueMax, driver.StatusFlowMax:
		return r.refused(l, res)
	}
	if c.learned {
		st := start{id: uint64(res.Start), at: res.Start * int64(time.Microsecond), counts: res.Counts}
		if i, limit := r.overLearned(l, st); i >= 0 {
			if !again {
				return outcome{full: -1, overCut: true}
			}
			// A second cut meanwhile: given back, its removal serving the
			// queues under the caps now.
			r.cutLimits(l)
			r.takeBack(l)
			le := &slots.LimitError{Err: slots.ErrLimitReached, Key: l.names[i], InFlight: int(res.Counts[i]) - l.units,
				Limit: limit, RetryAfter: time.Second}
			// From the key's holds (the Registry's, before any ended
			// here), its units over the cap counted ahead of it.
			le.RetryAfter = r.refusalRetryAfter(l, i, le, le.InFlight-limit, 0, 0, true)
			return outcome{err: le, full: i, inFlight: le.InFlight}
		}
		l.start = st
	}
	r.leftFleet(w) // before it takes its local slot
	return r.hold(ctx, l, false, epoch, seen)
}

// refused tells the store's refusal res of l: a full key, or a queue at
// its bound.
func (r *Registry[K]) refused(l *lease[K], res driver.AdmitResult) outcome {
	i := max(res.Key, 0)
	le := &slots.LimitError{Err: slots.ErrLimitReached, Key: r.keyName(l.keys[i]), InFlight: int(res.Count),
		Limit: l.limits[i], Queued: int(res.Queue), RetryAfter: time.Second}
	var retryIn time.Duration
	if res.Earliest > res.Now {
		retryIn = time.Duration(res.Earliest-res.Now) * time.Millisecond
		le.RetryAfter = max(time.Second, retryIn.Round(time.Second))
	}
	if res.Status != driver.StatusFull {
		le.Err = slots.ErrQueueFull
		le.RetryAfter = r.refusalRetryAfter(l, i, le, le.Queued, 0, 0, true)
		return failed(le)
	}
	// A key at its limit: its earliest lease's expiry, which a live holder
	// keeps renewing, is a bound, not a time; the key's holds tell one.
	le.RetryAfter = r.refusalRetryAfter(l, i, le, le.Queued, 0, 0, false)
	return outcome{err: le, full: i, retryIn: retryIn, inFlight: le.InFlight, queuedN: le.Queued}
}

// callOrAbandon makes l's acquire call; for a waiter w not yet queued in
// the store, in line behind the calls of the waiters before it (see calls).
// A call that carries no epoch yet (this process has had no reply from
// the store) is not: the waiters after it wait for its reply, so that theirs
// carry the epoch it tells and a store that lost its data meanwhile
// pauses them. A waiter queued in the store already has its place there (as
// its current lease id, in the store of the epoch its call carries). If
// the call panics (a client hook), whatever it may have added is taken
// back before the panic goes on: l is not held, so nothing else would
// renew or remove it.
func (r *Registry[K]) callOrAbandon(ctx context.Context, l *lease[K], c acquireCall[K], w *waiter) reply {
	l.until = max(l.until, c.until) // l is not shared yet
	ok := false
	defer func() {
		if !ok {
			r.sendAbandonment(l)
		}
	}()
	var placed func()
	if w != nil && (w.queuedAs != l.id || w.queuedEpoch != c.epoch) && c.epoch != 0 {
		placed = func() { r.placed(w) }
	}
	claim := false
	if w != nil {
		r.waits.mu.Lock()
		claim = w.granted != "" && w.granted == l.id
		r.waits.mu.Unlock()
	}
	rp := r.call(ctx, c.call, c.until, placed, claim)
	ok = true
	if claim && rp.err == nil && rp.res.Status != driver.StatusAdmitted && rp.res.Status != driver.StatusTooLate {
		// The grant is gone (given back, or its claim window ran out):
		// the ticket's next call asks, in the admissions' lane.
		r.waits.mu.Lock()
		if w.granted == l.id {
			w.granted = ""
		}
		r.waits.mu.Unlock()
	}
	return rp
}

// takeBack takes whatever l's id holds, or a failed call for l may have
// put, out of the store (see sendAbandonment), and gives l a new id for
// what comes next.
func (r *Registry[K]) takeBack(l *lease[K]) {
	r.sendAbandonment(l)
	l.id = newLeaseID()
}

// sendAbandonment takes whatever l's id holds out of the store: through
// the releaser, without waiting for the store, while the Registry runs;
// once it is closed, now (the releaser has stopped), within the call
// timeout, the wait for storeMu included (see removeAfterStop): the
// waiters that Close ends each take their place back at once, not one
// after another.
func (r *Registry[K]) sendAbandonment(l *lease[K]) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		r.removeAfterStop([]*lease[K]{l.abandonment()})
	} else {
		r.queueRelease(l.abandonment())
	}
}

// hold finishes an admission: the local mirror slot, the lease record, and
// the Slot. With degraded, the lease is not in the store (yet); else the store
// admitted it under epoch. A caller whose context has ended by the time the
// lease is recorded is not admitted: the lease is given back.
//
// l is counted before its local slot is tried (see counting), so that an
// admission of the other kind made meanwhile counts it whichever goes
// first: a store's admission as held without a local slot until the local
// registry holds it, one outside the store as such until it is in the
// store.
//
// seen is heldLeases.wentIn as the store decided l's admission, with the
// leases its own call put in (see outsideMeanwhile); degraded, unused.
func (r *Registry[K]) hold(ctx context.Context, l *lease[K], degraded bool, epoch int64, seen uint64) outcome {
	if ctx.Err() != nil {
		return r.giveBack(ctx, l, degraded, false)
	}
	c := r.counting(l, degraded)
	defer c.undo() // unless the lease, recorded, has taken the count over
	var local *slots.Slot
	for try := 0; ; try++ {
		var err error
		if degraded {
			local, err = r.fallbackAcquire(l)
		} else if local, err = r.localAcquire(l); err == nil {
			c.undo() // the local registry counts it now
		}
		if !degraded {
			// A lease admitted outside the store since l's call left
			// (which carried none in) may hold the room: the store
			// admitted l without counting it. If a key full here holds
			// one, and more than the limit the store admitted l under, l
			// goes back; its next call carries that lease in. Full here
			// counts the leases held without a local slot: the local
			// registry, which does not, may have room for l.
			var le *slots.LimitError
			if err == nil || errors.As(err, &le) {
				if o, back := r.outsideMeanwhile(l, local, le, seen); back {
					return o
				}
			}
			if err == nil {
				break
			}
			// This process holds more than the store counts (leases lost and
			// not put back, or local limits other than the fleet's):
			// admit anyway; the store has counted this one. It is held
			// without a local slot (heldLeases.unmirrored).
			local = nil
			break
		}
		if err == nil {
			break
		}
		// The local cap is the cap now. One it can never hold fails for
		// good, as the store's would.
		var le *slots.LimitError
		if !errors.As(err, &le) || errors.Is(err, slots.ErrExceedsLimit) {
			return failed(err)
		}
		if o, ok := r.localFull(l, le); ok || try == 2 {
			o.local = true
			return o
		}
		// No key is full any more: a release came in between. Try again.
	}
	l.local = local
	x := new(core.Handle)
	h := x.Hold()
	h.Owner, l.hold = l, h
	h.At = time.Now().UnixNano()
	h.Degraded, h.Extra = degraded, int32(l.units-1)
	if r.holdHook != nil {
		r.holdHook()
	}
	r.mu.Lock()
	if r.closed || ctx.Err() != nil {
		closed := r.closed
		r.mu.Unlock()
		return r.giveBack(ctx, l, degraded, closed)
	}
	l.degraded, l.epoch = degraded, epoch
	if degraded {
		r.held.degraded[l] = struct{}{}
		r.held.degradedPeak = max(r.held.degradedPeak, len(r.held.degraded))
	}
	r.held.leases[l] = struct{}{}
	r.held.leasesPeak = max(r.held.leasesPeak, len(r.held.leases))
	l.unmirrored = !degraded && local == nil
	c.done = true // released with the lease (see releasing)
	learned := !degraded && l.start.counts != nil && r.started(l)
	r.mu.Unlock()
	if learned {
		for _, k := range l.keys {
			r.applyLearned(k)
		}
		r.kickLearner()
	}
	if degraded {
		r.stats.degraded.Add(1)
	} else {
		r.stats.acquired.Add(1)
	}
	return outcome{slot: (*slots.Slot)(x), full: -1}
}

// giveBack undoes an admission of l that is not to be: its local mirror,
// and, if the store admitted it, its lease (with a wake-up, as a release). It
// returns ErrClosed, or the error of ctx, which has ended.
func (r *Registry[K]) giveBack(ctx context.Context, l *lease[K], degraded, closed bool) outcome {
	func() {
		// Deferred, so that the lease leaves the store even if the local
		// release panics (an Observer), as in Release.
		switch {
		case degraded:
		case closed:
			defer r.removeAfterStop([]*lease[K]{l.abandonment()}) // the releaser may have stopped
		default:
			defer r.queueRelease(l)
		}
		l.releaseLocal()
	}()
	o := failed(ErrClosed)
	if !closed {
		o = failed(fmt.Errorf("fleet: acquire: %w", ctx.Err()))
	}
	o.gone = !degraded
	return o
}

// localAcquire takes the mirror of l, which the store admitted, in the
// local registry. If that panics (an Observer, a local LimitFunc), the
// lease is taken back, as in Release: it is not held, so nothing would
// renew or remove it.
func (r *Registry[K]) localAcquire(l *lease[K]) (*slots.Slot, error) {
	ok := false
	defer func() {
		if !ok {
			r.sendAbandonment(l)
		}
	}()
	s, err := r.local.TryAcquireAllN(l.units, l.keys...)
	ok = true
	return s, err
}

// localFull tells the local registry's refusal le of l again, naming the
// first of l's keys that is full there by its name in the store, as a refusal
// by the store names it. It reports false if none is full any more (le
// is kept, told as of the first key, with its holders counted now).
func (r *Registry[K]) localFull(l *lease[K], le *slots.LimitError) (outcome, bool) {
	for i, k := range l.keys {
		n, limit := r.localHeld(k), r.local.Limit(k)
		if n+l.units > limit {
			err := &slots.LimitError{Err: le.Err, Key: r.keyName(k), InFlight: n, Limit: limit, RetryAfter: le.RetryAfter}
			return outcome{err: err, full: i, inFlight: n}, true
		}
	}
	return outcome{err: le, full: 0, inFlight: r.localHeld(l.keys[0])}, false
}
