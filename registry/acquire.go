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
	return r.AcquireN(ctx, key, 1)
}

// TryAcquireN is TryAcquire for a Slot that weighs n units (see AcquireN).
func (r *Registry[K]) TryAcquireN(key K, n int) (*slots.Slot, error) {
	if err := r.eng.Check(nil, n, false); err != nil {
		return nil, err
	}
	return r.acquireOne(nil, key, n)
}

// AcquireN is Acquire for a Slot that weighs n units of key's limit
// (tokens, bytes: what a request costs), all freed by its Release. Later
// callers of key alone may pass a waiter whose n units do not fit, as on
// a slots.Limiter; a caller of several keys does not. It also fails with
// slots.ErrBadUnits for n outside 1..slots.MaxUnits, and with a
// *slots.LimitError wrapping slots.ErrExceedsLimit when the key's limit
// can never hold n: at once, or while it waits once the limit is lowered
// below n (a limit of 0 is a pause and refuses nobody).
func (r *Registry[K]) AcquireN(ctx context.Context, key K, n int) (*slots.Slot, error) {
	if err := r.eng.Check(ctx, n, true); err != nil {
		return nil, err
	}
	return r.acquireOne(ctx, key, n)
}

// asError is a rejection as the registry returns it.
func asError(rej *core.Rejection) error { return (*slots.LimitError)(rej) }

// acquireOne admits n units under one key; ctx == nil means do not wait.
func (r *Registry[K]) acquireOne(ctx context.Context, key K, n int) (*slots.Slot, error) {
	if err := r.checkKey(ctx, key); err != nil {
		return nil, err
	}
	sh, hash := r.shardFor(key)
	fetched := -1
	if r.limitFunc != nil {
		var err error
		if fetched, err = r.refreshLimit(ctx, sh, key); err != nil {
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
	var serve []*entry[K]
	e := sh.lanes.get(key, hash)
	if e != nil && e.lane.Multi > 0 {
		sh.mu.Unlock()
		r.multiMu.Lock()
		e, set, serve = r.lockBeside(sh, key, hash)
		r.grantLocked(serve, &wk) // first (see lockBeside)
		if ctx != nil && r.eng.Shares == nil {
			place = core.PlaceOf(ctx) // the class matters beside them
			h.Class = place.Class
		}
	}
	d := core.Cancel()
	if core.Ended(ctx) {
		sh.st.canceled++
	} else {
		if e == nil {
			// Dropped again if the caller neither holds nor waits.
			e = sh.addLocked(r, key, hash, r.limitLocked(sh, key, fetched))
		}
		// Waiters that also need other keys may be queued while a key has
		// room; only a waiter for this key alone would be passed, or the
		// slot kept for one of them (admitsLocked).
		if admitsLocked(e, h.Class, n) {
			h.Owner = e
			if set != nil {
				passLocked(e, h.Class, newcomer, nil)
			}
			sh.holdLocked(r, e, h, &h.Idx)
			if anyHeavy(serve) {
				r.grantLocked(serve, &wk)
			}
			d = core.Admit()
		} else {
			d = r.refuseOrQueueLocked(ctx, key, e, h, n, place, &wk)
		}
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
// under key, whose entry is e, that cannot be admitted now: it is refused,
// or queued. Call with acquireOne's locks.
func (r *Registry[K]) refuseOrQueueLocked(ctx context.Context, key K, e *entry[K], h *core.Hold, n int, place core.Place, wk *core.Wakes) core.Decision {
	if ctx != nil && r.eng.Shares == nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	reason := r.refusalLocked(ctx, e, h.Class, n, place.Flow)
	if reason == nil || reason == slots.ErrQueueFull && e.lane.Waiters.Heavy() > 0 {
		h.Owner = e
		w := r.eng.Waiter(h)
		w.Seq = r.waitSeq.Add(1)
		w.Place(place)
		// Beside multi-key waiters the shards they need are locked (set),
		// and the others were served in lockBeside: the newcomer changed
		// this key's queue alone.
		if e.lane.Waiters.Beside(w, reason, func() { r.grantLocked([]*entry[K]{e}, wk) }) {
			return core.Wait(w, &keyWait[K]{e: e, key: key})
		}
	}
	if reason == slots.ErrQueueFull {
		e.shard.st.queueFull++
	}
	rej := r.rejectLocked(reason, key, e, n, h.Class)
	e.shard.dropUnusedLocked(e)
	return core.Refuse(rej)
}

// lockBeside takes the shard locks to decide an admission under key, or
// to change its limit, where multi-key waiters may queue: key's shard (sh)
// and, while such waiters are there, their shards (lockForGrant). Call
// with multiMu held. It returns key's entry (nil if it is not live), the
// shards it locked, and the entries to serve (nil without such waiters).
// An admission serves them before it decides, so that a newcomer neither
// passes one that could be served nor takes a slot kept for one
// (admitsLocked).
func (r *Registry[K]) lockBeside(sh *shard[K], key K, hash uint64) (*entry[K], []int, []*entry[K]) {
	sh.mu.Lock()
	e := sh.lanes.get(key, hash)
	if e == nil || e.lane.Multi == 0 {
		return e, []int{sh.idx}, nil
	}
	// Its multi-key waiters leave only under multiMu, so e stays live and
	// they stay queued while the shards they need are locked.
	sh.mu.Unlock()
	set, serve := r.lockForGrant([]*entry[K]{e}, nil)
	return e, set, serve
}

// refusalLocked returns why a caller of class c weighing n units, of
// flow, that cannot be admitted under e now may not queue there either (and
// counts it), or nil. ctx == nil is a call that does not wait.
func (r *Registry[K]) refusalLocked(ctx context.Context, e *entry[K], c uint8, n int, flow string) error {
	switch {
	case n > 1 && e.lane.TooHeavy(c, n):
		r.exceedsLimit.Add(1)
		return slots.ErrExceedsLimit
	case ctx == nil:
		e.shard.st.limitReached++
		return slots.ErrLimitReached
	case r.eng.Full(&e.lane.Waiters, flow): // counted by the refusal
		return slots.ErrQueueFull
	}
	return nil
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
		return core.Ending{Rej: r.rejectKey(slots.ErrExceedsLimit, key, w)}
	}
	sh.mu.Lock()
	switch {
	case out == core.OutCanceled || out == core.OutDeadline:
		sh.st.canceled++
	case r.eng.FailOpen:
		sh.st.bypassed++
		sh.seq++
		w.Hold.ID = sh.seq<<r.shardBits | uint64(sh.idx)
		sh.mu.Unlock()
		return core.Ending{Bypass: "key", Attrs: []slog.Attr{slog.String("key", keyString(key))}}
	default:
		sh.st.waitTimeouts++
	}
	sh.mu.Unlock()
	if out == core.OutCanceled {
		return core.Ending{}
	}
	// Timed out; or its deadline passed, told as if it had timed out.
	return core.Ending{Rej: r.rejectKey(slots.ErrWaitTimeout, key, w)}
}

// rejectKey builds a rejection for key, of waiter w, under its shard's lock.
func (r *Registry[K]) rejectKey(reason error, key K, w *core.Waiter) *core.Rejection {
	sh, hash := r.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.lanes.get(key, hash); e != nil {
		return r.rejectLocked(reason, key, e, w.Hold.Units(), w.Class)
	}
	return r.eng.Reject(reason, keyString(key), 0, r.limitLocked(sh, key, -1), 0)
}
