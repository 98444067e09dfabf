package registry

import (
	"context"
	"log/slog"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// TryAcquire admits a Slot under key if the key has room, without waiting.
// Otherwise it returns a *slots.LimitError wrapping slots.ErrLimitReached
// and inserts nothing. Keys over the WithMaxKeyBytes bound fail with
// ErrInvalidKey.
func (r *Registry[K]) TryAcquire(key K) (*slots.Slot, error) {
	return r.acquireOne(nil, key, 1)
}

// Acquire admits a Slot under key, waiting in arrival order while the key is
// full. It fails like slots.Limiter.Acquire: *slots.LimitError (queue full,
// wait timeout), an error wrapping ctx.Err(), or slots.ErrNilContext; with
// WithFailOpen a wait that reaches the maximum returns a Bypassed slot.
// A key whose limit is 0 waits until SetLimit raises it.
func (r *Registry[K]) Acquire(ctx context.Context, key K) (*slots.Slot, error) {
	if ctx == nil {
		r.eng.Rejected(nil, slots.ErrNilContext, 0)
		return nil, slots.ErrNilContext
	}
	return r.acquireOne(ctx, key, 1)
}

// endedLocked reports whether ctx (nil: a call that does not wait) has
// ended. Admissions ask it under their locks, as the last check before they
// decide: asked before, a context that ends and a slot that frees in between
// would admit a caller that has given up.
func endedLocked(ctx context.Context) bool { return ctx != nil && core.Ended(ctx) }

// pending is a Slot on its way to the caller: its record, and with leak
// detection the tracked hold admitted for it (see core.Tracked).
type pending struct {
	x *core.Handle
	t *core.Tracked
}

// newHold returns a pending Slot and the hold to admit for it; its Owner is
// set by the caller, once the key's entry is known.
func (r *Registry[K]) newHold() (pending, *core.Hold) {
	x, h, t := r.eng.NewSlot(nil, 2) // above acquireOne or acquireAll, and the exported method
	return pending{x, t}, h
}

// acquired hands out an admitted Slot and reports it, under ctx (nil: a
// TryAcquire).
func (r *Registry[K]) acquired(ctx context.Context, p pending, wait time.Duration) *slots.Slot {
	return (*slots.Slot)(r.eng.Acquired(ctx, p.x, p.t, wait))
}

// rejected reports a rejection decided under locks now released, of a
// caller that waited wait under ctx.
func (r *Registry[K]) rejected(ctx context.Context, rej *core.Rejection, wait time.Duration) error {
	r.eng.Rejected(ctx, rej.Err, wait)
	return (*slots.LimitError)(rej)
}

// acquireOne admits n units under one key; ctx == nil means do not wait.
func (r *Registry[K]) acquireOne(ctx context.Context, key K, n int) (*slots.Slot, error) {
	if err := r.checkKey(ctx, key); err != nil {
		return nil, err
	}
	sh, hash := r.shardFor(key)
	if r.limitFunc != nil {
		if err := r.refreshLimit(ctx, sh, key); err != nil {
			return nil, err
		}
	}
	p, h := r.newHold()
	h.At = r.eng.Clock.Coarse()
	if n != 1 {
		h.SetUnits(n)
	}
	// The caller's place matters to an admission only with shares; without
	// them it is read once the caller has to wait.
	var place core.Place
	if ctx != nil && r.eng.Shares != nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}

	sh.mu.Lock()
	var wk core.Wakes
	// set is nil while sh.mu alone is held; beside multi-key waiters it is
	// the shards held, with multiMu (lockBeside).
	var set []int
	e := sh.lookup(key, hash)
	if e != nil && e.lane.Multi > 0 {
		sh.mu.Unlock()
		e, set = r.lockBeside(sh, key, hash, &wk)
		if ctx != nil && r.eng.Shares == nil {
			place = core.PlaceOf(ctx) // the class matters beside them
			h.Class = place.Class
		}
	}
	if endedLocked(ctx) {
		r.unlockOne(sh, set, &wk)
		return nil, r.eng.Canceled(ctx, 0)
	}
	limit := 0
	var room bool
	if e != nil {
		// Waiters that also need other keys may be queued while this key
		// has room; only a waiter for this key alone would be passed, or
		// the slot kept for one of them (admitsLocked).
		room = admitsLocked(e, h.Class, n)
	} else {
		limit = r.limitLocked(sh, key)
		room = r.freshAdmits(limit, h.Class, n)
	}
	if room {
		if e == nil {
			e = sh.addLocked(r, key, hash, limit)
		}
		h.Owner = e
		if set != nil {
			passLocked(e, h.Class, newcomer, nil)
		}
		sh.holdLocked(r, e, h, &h.Idx)
		r.unlockOne(sh, set, &wk)
		return r.acquired(ctx, p, 0), nil
	}
	if ctx != nil && r.eng.Shares == nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	if r.tooHeavy(e, limit, h.Class, n) {
		r.exceedsLimit.Add(1)
		rej := r.rejectLocked(slots.ErrExceedsLimit, key, e, limit)
		r.unlockOne(sh, set, &wk)
		return nil, r.rejected(ctx, rej, 0)
	}
	if ctx == nil {
		sh.st.limitReached++
		rej := r.rejectLocked(slots.ErrLimitReached, key, e, limit)
		r.unlockOne(sh, set, &wk)
		return nil, r.rejected(ctx, rej, 0)
	}
	if r.eng.Full(e.queue(), place.Flow) {
		sh.st.queueFull++
		rej := r.rejectLocked(slots.ErrQueueFull, key, e, limit)
		r.unlockOne(sh, set, &wk)
		return nil, r.rejected(ctx, rej, 0)
	}
	if e == nil {
		e = sh.addLocked(r, key, hash, limit)
	}
	return r.waitOneLocked(ctx, p, h, e, key, place, set, &wk)
}

// lockBeside takes the locks to decide an admission under key, on which
// multi-key waiters queue: multiMu and, while such waiters are still there,
// their shards; and it serves what they can take now, so that a newcomer
// neither passes one that could be served nor takes a slot kept for one
// (admitsLocked). It returns key's entry (nil if it went meanwhile) and the
// shards it locked.
func (r *Registry[K]) lockBeside(sh *shard[K], key K, hash uint64, wk *core.Wakes) (*entry[K], []int) {
	r.multiMu.Lock()
	sh.mu.Lock()
	e := sh.lookup(key, hash)
	if e == nil || e.lane.Multi == 0 {
		return e, []int{sh.idx}
	}
	// Its multi-key waiters leave only under multiMu, so e stays live.
	sh.mu.Unlock()
	set, serve := r.lockForGrant([]*entry[K]{e}, nil)
	r.grantLocked(serve, wk)
	return e, set
}

// unlockOne releases what acquireOne holds (see set there) and wakes the
// waiters granted meanwhile.
func (r *Registry[K]) unlockOne(sh *shard[K], set []int, wk *core.Wakes) {
	if set == nil {
		sh.mu.Unlock()
	} else {
		r.unlockShards(set)
		r.multiMu.Unlock()
	}
	wk.Wake()
}

// freshAdmits reports whether a key that is not live, with limit, admits a
// newcomer of class c weighing n units.
func (r *Registry[K]) freshAdmits(limit int, c uint8, n int) bool {
	if r.eng.Shares == nil || limit <= 0 {
		return n <= limit
	}
	ln := core.Lane{Limit: limit, Shares: r.eng.Shares}
	return ln.CanTake(c, n)
}

// tooHeavy reports whether a caller of class c weighing n units must be
// refused at key, with entry e (nil: a key that is not live, with limit),
// because the key can never admit it (core.Lane.TooHeavy).
func (r *Registry[K]) tooHeavy(e *entry[K], limit int, c uint8, n int) bool {
	if n == 1 {
		return false
	}
	if e != nil {
		return e.lane.TooHeavy(c, n)
	}
	ln := core.Lane{Limit: limit, Shares: r.eng.Shares}
	return ln.TooHeavy(c, n)
}

// queue returns e's queue, or nil for a key that is not live.
func (e *entry[K]) queue() *core.Queue {
	if e == nil {
		return nil
	}
	return &e.lane.Waiters
}

// waitOneLocked queues p's hold h on e and waits. It is called with
// acquireOne's locks held (e's shard, or set and multiMu) and unlocks them.
// It is apart from acquireOne so that the closure below does not move
// acquireOne's variables to the heap on the fast path.
func (r *Registry[K]) waitOneLocked(ctx context.Context, p pending, h *core.Hold, e *entry[K], key K, place core.Place, set []int, wk *core.Wakes) (*slots.Slot, error) {
	h.Owner = e
	start := h.At
	w := core.NewWaiter(h)
	w.Seq = r.waitSeq.Add(1)
	w.Place(place)
	e.lane.Waiters.Push(&w.Elem)
	if e.lane.Waiters.Heavy() > 0 {
		// Beside a heavy waiter a newcomer may queue where it might be
		// served (core.Lane.Admits, admitsLocked): serve the queue, in
		// order.
		// Beside multi-key waiters the shards they need are locked (set),
		// and the others were served in lockBeside: the newcomer changed
		// this key's queue alone.
		r.grantLocked([]*entry[K]{e}, wk)
	}
	r.unlockOne(e.shard, set, wk)
	return r.await(ctx, p, w, start, e.shard, key, nil, func(w *core.Waiter) bool { return r.withdrawOne(e, w) })
}

// await waits for w and turns the outcome into Acquire's result.
//
// start is the hold's acquire time as it was before w was queued: once
// queued, a grant may overwrite it at any moment. refusedBy, for a
// multi-key waiter, is where the key that refuses it is written.
func (r *Registry[K]) await(ctx context.Context, p pending, w *core.Waiter, start int64, sh *shard[K], key K, refusedBy *K, withdraw func(*core.Waiter) bool) (*slots.Slot, error) {
	h := w.Hold
	switch r.eng.Wait(ctx, w, r.eng.MaxWait, withdraw) {
	case core.OutGranted:
		return r.acquired(ctx, p, time.Duration(h.At-start)), nil
	case core.OutCanceled:
		sh.mu.Lock()
		sh.st.canceled++
		sh.mu.Unlock()
		return nil, r.eng.Canceled(ctx, r.eng.Since(start))
	case core.OutRefused: // counted by the limit change that refused it
		if refusedBy != nil {
			key = *refusedBy
		}
		ksh, khash := r.shardFor(key)
		ksh.mu.Lock()
		rej := r.rejectLocked(slots.ErrExceedsLimit, key, ksh.lookup(key, khash), r.limitLocked(ksh, key))
		ksh.mu.Unlock()
		return nil, r.rejected(ctx, rej, r.eng.Since(start))
	}
	// The wait expired.
	if r.eng.FailOpen {
		sh.mu.Lock()
		sh.st.bypassed++
		sh.seq++
		h.ID = sh.seq<<r.shardBits | uint64(sh.idx)
		sh.mu.Unlock()
		r.eng.Bypass(ctx, h, start, r.eng.MaxWait, "key", slog.String("key", keyString(key)))
		return (*slots.Slot)(r.eng.HandOut(p.x, p.t)), nil
	}
	ksh, khash := r.shardFor(key)
	if ksh != sh {
		sh.mu.Lock()
		sh.st.waitTimeouts++
		sh.mu.Unlock()
	}
	ksh.mu.Lock()
	if ksh == sh {
		sh.st.waitTimeouts++
	}
	rej := r.rejectLocked(slots.ErrWaitTimeout, key, ksh.lookup(key, khash), r.limitLocked(ksh, key))
	ksh.mu.Unlock()
	return nil, r.rejected(ctx, rej, r.eng.Since(start))
}
