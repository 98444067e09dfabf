package registry

import (
	"context"
	"fmt"
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
	return r.acquireOne(nil, key)
}

// Acquire admits a Slot under key, waiting in arrival order while the key is
// full. It fails like slots.Limiter.Acquire: *slots.LimitError (queue full,
// wait timeout), an error wrapping ctx.Err(), or slots.ErrNilContext; with
// WithFailOpen a wait that reaches the maximum returns a Bypassed slot.
// A key whose limit is 0 waits until SetLimit raises it.
func (r *Registry[K]) Acquire(ctx context.Context, key K) (*slots.Slot, error) {
	if ctx == nil {
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrNilContext})
		return nil, slots.ErrNilContext
	}
	return r.acquireOne(ctx, key)
}

// endedLocked reports whether ctx (nil: a call that does not wait) has
// ended. Admissions ask it under their locks, as the last check before they
// decide: asked before, a context that ends and a slot that frees in between
// would admit a caller that has given up.
func endedLocked(ctx context.Context) bool { return ctx != nil && core.Ended(ctx) }

// canceled reports a caller whose context ended before it was admitted.
func (r *Registry[K]) canceled(ctx context.Context) error {
	r.emit(slots.Event{Kind: slots.EventRejected, Err: ctx.Err()})
	return fmt.Errorf("registry: acquire: %w", ctx.Err())
}

// pending is a Slot on its way to the caller. Without leak detection the
// hold admitted is the Slot's own; with it, a tracked hold apart from the
// Slot (see core.Tracked), for which the Slot becomes a stand-in.
type pending struct {
	s       *slots.Slot
	standIn *core.Hold // the hold inside s
	t       *core.Tracked
}

// newHold returns a pending Slot and the hold to admit for it.
func (r *Registry[K]) newHold() (pending, *core.Hold) {
	v, own := core.NewSlot()
	p := pending{s: v.(*slots.Slot), standIn: own}
	if !r.cfg.wait.LeakCheck {
		return p, own
	}
	p.t = new(core.Tracked)
	if r.cfg.wait.LeakSites {
		p.t.RecordSite(3) // above newHold, acquireOne or acquireAll, and the exported method
	}
	return p, &p.t.Hold
}

// handOut finishes an admission and returns the Slot.
func (p pending) handOut() *slots.Slot {
	if p.t != nil {
		core.AttachTo(p.t, p.s, p.standIn)
	}
	return p.s
}

// acquireOne admits under one key; ctx == nil means do not wait.
func (r *Registry[K]) acquireOne(ctx context.Context, key K) (*slots.Slot, error) {
	if err := r.checkKey(key); err != nil {
		return nil, err
	}
	sh, hash := r.shardFor(key)
	if r.limitFunc != nil {
		if err := r.refreshLimit(ctx, sh, key); err != nil {
			return nil, err
		}
	}
	p, h := r.newHold()
	h.At = r.clk.Coarse()
	// The caller's place matters to an admission only with shares; without
	// them it is read once the caller has to wait.
	var place core.Place
	if ctx != nil && r.shares != nil {
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
		if ctx != nil && r.shares == nil {
			place = core.PlaceOf(ctx) // the class matters beside them
			h.Class = place.Class
		}
	}
	if endedLocked(ctx) {
		r.unlockOne(sh, set, &wk)
		return nil, r.canceled(ctx)
	}
	limit := 0
	var room bool
	if e != nil {
		// Waiters that also need other keys may be queued while this key
		// has room; only a waiter for this key alone would be passed, or
		// the slot kept for one of them (admitsLocked).
		room = admitsLocked(e, h.Class)
	} else {
		limit = r.limitLocked(sh, key)
		room = r.freshAdmits(limit, h.Class)
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
		return r.acquired(p, 0), nil
	}
	if ctx == nil {
		sh.st.limitReached++
		err := r.rejectLocked(slots.ErrLimitReached, key, e, limit)
		r.unlockOne(sh, set, &wk)
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrLimitReached})
		return nil, err
	}
	if r.shares == nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	if r.queueFullLocked(e, place.Flow) {
		sh.st.queueFull++
		err := r.rejectLocked(slots.ErrQueueFull, key, e, limit)
		r.unlockOne(sh, set, &wk)
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrQueueFull})
		return nil, err
	}
	if e == nil {
		e = sh.addLocked(r, key, hash, limit)
	}
	return r.waitOne(ctx, p, h, e, key, place, set, &wk)
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

// acquired hands out an admitted Slot and reports it. If the Observer
// panics the Slot is released, since it never reaches its caller.
func (r *Registry[K]) acquired(p pending, wait time.Duration) *slots.Slot {
	s := p.handOut()
	if r.obs != nil {
		ok := false
		defer func() {
			if !ok {
				s.Release()
			}
		}()
		r.obs.Observe(slots.Event{Kind: slots.EventAcquired, Wait: wait})
		ok = true
	}
	return s
}

// freshAdmits reports whether a key that is not live, with limit, admits a
// newcomer of class c.
func (r *Registry[K]) freshAdmits(limit int, c uint8) bool {
	if r.shares == nil || limit <= 0 {
		return limit > 0
	}
	ln := core.Lane{Limit: limit, Shares: r.shares}
	return ln.CanTake(c)
}

// queueFullLocked reports whether a caller of flow must be turned away from
// e's queue (nil: the key is not live, nobody waits).
func (r *Registry[K]) queueFullLocked(e *entry[K], flow string) bool {
	if e == nil {
		return r.cfg.wait.QueueFull(0) || r.cfg.wait.FlowQueueFull(0)
	}
	q := &e.lane.Waiters
	return r.cfg.wait.QueueFull(q.Len()) ||
		r.cfg.wait.BoundFlowQueue && r.cfg.wait.FlowQueueFull(q.FlowLen(flow))
}

// waitOne queues s's hold on e and waits. Called with acquireOne's locks
// held (e's shard, or set and multiMu); it unlocks them. (Kept apart from acquireOne so that the closure below does not
// move acquireOne's variables to the heap on the fast path.)
func (r *Registry[K]) waitOne(ctx context.Context, p pending, h *core.Hold, e *entry[K], key K, place core.Place, set []int, wk *core.Wakes) (*slots.Slot, error) {
	h.Owner = e
	start := h.At
	w := core.NewWaiter(h)
	w.Seq = r.waitSeq.Add(1)
	w.Place(place)
	e.lane.Waiters.Push(&w.Elem)
	r.unlockOne(e.shard, set, wk)
	return r.await(ctx, p, w, start, e.shard, key, func(w *core.Waiter) bool { return r.withdrawOne(e, w) })
}

// await waits for w and turns the outcome into Acquire's result.
//
// start is the hold's acquire time as it was before w was queued: once
// queued, a grant may overwrite it at any moment.
func (r *Registry[K]) await(ctx context.Context, p pending, w *core.Waiter, start int64, sh *shard[K], key K, withdraw func(*core.Waiter) bool) (*slots.Slot, error) {
	var expire <-chan time.Time
	if r.cfg.wait.MaxWait > 0 {
		c, stop := r.clk.Timer(r.cfg.wait.MaxWait)
		defer stop()
		expire = c
	}
	h := w.Hold
	out := core.Await(ctx, w, expire, withdraw)
	switch out {
	case core.OutGranted:
		return r.acquired(p, time.Duration(h.At-start)), nil
	case core.OutCanceled:
		sh.mu.Lock()
		sh.st.canceled++
		sh.mu.Unlock()
		r.emit(slots.Event{Kind: slots.EventRejected, Err: ctx.Err()})
		return nil, fmt.Errorf("registry: acquire: %w", ctx.Err())
	}
	if r.cfg.wait.FailOpen {
		core.Bypass(h)
		h.At = r.clk.Coarse() // the clock start was read on
		sh.mu.Lock()
		sh.st.bypassed++
		sh.seq++
		h.ID = sh.seq<<r.shardBits | uint64(sh.idx)
		sh.mu.Unlock()
		if r.satLog.Allow(h.At, saturationLogEvery) {
			r.cfg.wait.Log().Warn("registry: key saturated; admitting without a slot (fail-open)",
				slog.String("key", keyString(key)), slog.Uint64("slot_id", h.ID),
				slog.Duration("max_wait", r.cfg.wait.MaxWait))
		}
		r.emit(slots.Event{Kind: slots.EventBypassed, Wait: time.Duration(h.At - start)})
		return p.handOut(), nil
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
	err := r.rejectLocked(slots.ErrWaitTimeout, key, ksh.lookup(key, khash), r.limitLocked(ksh, key))
	ksh.mu.Unlock()
	r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrWaitTimeout})
	return nil, err
}

// emit hands e to the Observer, if there is one. Call without locks.
func (r *Registry[K]) emit(e slots.Event) {
	if r.obs != nil {
		r.obs.Observe(e)
	}
}
