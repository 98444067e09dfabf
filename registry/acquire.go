package registry

import (
	"context"
	"log/slog"

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
	if err := r.eng.CheckContext(ctx); err != nil {
		return nil, err
	}
	return r.acquireOne(ctx, key, 1)
}

// asError is a rejection as the registry returns it.
func asError(rej *core.Rejection) error { return (*slots.LimitError)(rej) }

// endedLocked reports whether ctx (nil: a call that does not wait) has
// ended. Admissions ask it under their locks, as the last check before they
// decide: asked before, a context that ends and a slot that frees in between
// would admit a caller that has given up.
func endedLocked(ctx context.Context) bool { return ctx != nil && core.Ended(ctx) }

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
	// Its Owner is set once the key's entry is known.
	x, h, t := r.eng.Begin(nil, n, 1)
	// The caller's place matters to an admission only with shares; without
	// them it is read once the caller has to wait.
	var place core.Place
	if ctx != nil && r.eng.Shares != nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	var wk core.Wakes
	sh.mu.Lock()
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
	var d core.Decision
	limit := 0
	if e == nil {
		limit = r.limitLocked(sh, key)
	}
	switch {
	case endedLocked(ctx):
		d = core.Cancel()
	// Waiters that also need other keys may be queued while a key has
	// room; only a waiter for this key alone would be passed, or the slot
	// kept for one of them (admitsLocked).
	case e != nil && admitsLocked(e, h.Class, n) || e == nil && r.freshAdmits(limit, h.Class, n):
		if e == nil {
			e = sh.addLocked(r, key, hash, limit)
		}
		h.Owner = e
		if set != nil {
			passLocked(e, h.Class, newcomer, nil)
		}
		sh.holdLocked(r, e, h, &h.Idx)
	default:
		d = r.refuseOrQueueLocked(ctx, sh, key, hash, e, limit, h, n, place, &wk)
	}
	if set == nil {
		sh.mu.Unlock()
	} else {
		r.unlockShards(set)
		r.multiMu.Unlock()
	}
	wk.Wake()
	x, err := r.eng.Finish(ctx, x, t, d)
	return (*slots.Slot)(x), err
}

// refuseOrQueueLocked decides for a caller of h, weighing n units, at place
// under key, whose entry is e (nil: not live, with limit), that cannot be
// admitted now: it is refused, or queued. Call with acquireOne's locks.
func (r *Registry[K]) refuseOrQueueLocked(ctx context.Context, sh *shard[K], key K, hash uint64, e *entry[K], limit int, h *core.Hold, n int, place core.Place, wk *core.Wakes) core.Decision {
	if ctx != nil && r.eng.Shares == nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	switch {
	case r.tooHeavy(e, limit, h.Class, n):
		r.exceedsLimit.Add(1)
		return core.Refuse(r.rejectLocked(slots.ErrExceedsLimit, key, e, limit))
	case ctx == nil:
		sh.st.limitReached++
		return core.Refuse(r.rejectLocked(slots.ErrLimitReached, key, e, limit))
	case r.eng.Full(e.queue(), place.Flow):
		sh.st.queueFull++
		return core.Refuse(r.rejectLocked(slots.ErrQueueFull, key, e, limit))
	}
	if e == nil {
		e = sh.addLocked(r, key, hash, limit)
	}
	h.Owner = e
	w := core.NewWaiter(h, r.eng.MaxWait)
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
	return core.Wait(w, &keyWait[K]{e: e, key: key})
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

// keyWait is a caller's wait on one key: its core.Waits.
type keyWait[K comparable] struct {
	e   *entry[K] // live while the caller waits
	key K
}

func (kw *keyWait[K]) Withdraw(w *core.Waiter) bool { return kw.e.shard.r.withdrawOne(kw.e, w) }

func (kw *keyWait[K]) Ended(w *core.Waiter, out core.Outcome) core.Ending {
	return kw.e.shard.r.ended(w, out, kw.e.shard, kw.key)
}

// ended counts a wait that took nothing on sh (the shard of the caller's
// first key) and answers it for key: the key that refused it (a limit
// lowered below its weight) or that it waited on (see core.Waits).
func (r *Registry[K]) ended(w *core.Waiter, out core.Outcome, sh *shard[K], key K) core.Ending {
	if out == core.OutRefused { // counted by the limit change that refused it
		return core.Ending{Rej: r.rejectKey(slots.ErrExceedsLimit, key)}
	}
	sh.mu.Lock()
	switch {
	case out == core.OutCanceled:
		sh.st.canceled++
		sh.mu.Unlock()
		return core.Ending{}
	case r.eng.FailOpen:
		sh.st.bypassed++
		sh.seq++
		w.Hold.ID = sh.seq<<r.shardBits | uint64(sh.idx)
		sh.mu.Unlock()
		return core.Ending{Bypass: "key", Attrs: []slog.Attr{slog.String("key", keyString(key))}}
	}
	sh.st.waitTimeouts++
	sh.mu.Unlock()
	return core.Ending{Rej: r.rejectKey(slots.ErrWaitTimeout, key)}
}

// rejectKey builds a rejection for key under its shard's lock.
func (r *Registry[K]) rejectKey(reason error, key K) *core.Rejection {
	sh, hash := r.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return r.rejectLocked(reason, key, sh.lookup(key, hash), r.limitLocked(sh, key))
}
