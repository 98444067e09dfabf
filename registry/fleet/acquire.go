package fleet

import (
	"context"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	ikeys "github.com/inflight-go/inflight/internal/keys"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// TryAcquire admits under key if it has room across the fleet, without
// waiting. It fails with a *slots.LimitError wrapping slots.ErrLimitReached,
// ErrUnavailable (FailClosed, the store unreachable), or an error wrapping
// registry.ErrInvalidKey (see registry.WithMaxKeyBytes).
func (r *Registry[K]) TryAcquire(key K) (*slots.Slot, error) {
	return r.acquire(context.Background(), 1, []K{key}, false)
}

// TryAcquireAll admits under every key at once, all or nothing, without
// waiting.
func (r *Registry[K]) TryAcquireAll(keys ...K) (*slots.Slot, error) {
	return r.acquire(context.Background(), 1, keys, false)
}

// Acquire admits under key, waiting while it is full across the fleet (in
// one queue per key for every process: see the package documentation),
// until ctx ends.
func (r *Registry[K]) Acquire(ctx context.Context, key K) (*slots.Slot, error) {
	return r.acquire(ctx, 1, []K{key}, true)
}

// AcquireAll admits under every key at once, all or nothing, waiting while
// any is full. A key listed twice counts once; no keys fail with
// registry.ErrNoKeys. A *slots.LimitError names a key that was full, by its
// name in the store (Keys.Name), whether the store or the local registry alone
// decided.
func (r *Registry[K]) AcquireAll(ctx context.Context, keys ...K) (*slots.Slot, error) {
	return r.acquire(ctx, 1, keys, true)
}

// TryAcquireN is TryAcquire for a Slot that weighs n units (see AcquireN).
func (r *Registry[K]) TryAcquireN(key K, n int) (*slots.Slot, error) {
	return r.acquire(context.Background(), n, []K{key}, false)
}

// AcquireN is Acquire for a Slot that weighs n units of key's limit across
// the fleet (a request's tokens, say), all freed by its Release: a key's
// count in the store is the sum of its leases' units. While a waiter's n
// units of a key do not fit, the key's later waiters and waiting
// newcomers of that key alone may take free units past it up to a bound
// (driver.ReleaseCall, as on one process); then they do not take them, so
// a heavy request is never starved by light ones. It also fails with an error wrapping
// slots.ErrBadUnits for n outside 1..slots.MaxUnits, and with a
// *slots.LimitError wrapping slots.ErrExceedsLimit when a key's limit (above
// 0) is below n: at once, or while it waits once the limit is lowered below
// n. Weight 1 is Acquire.
func (r *Registry[K]) AcquireN(ctx context.Context, key K, n int) (*slots.Slot, error) {
	return r.acquire(ctx, n, []K{key}, true)
}

// TryAcquireAllN is TryAcquireAll for a Slot that weighs n units on each
// key (see AcquireN).
func (r *Registry[K]) TryAcquireAllN(n int, keys ...K) (*slots.Slot, error) {
	return r.acquire(context.Background(), n, keys, false)
}

// AcquireAllN is AcquireAll for a Slot that weighs n units on each key
// (see AcquireN): a model's tokens in flight under a provider's, say.
func (r *Registry[K]) AcquireAllN(ctx context.Context, n int, keys ...K) (*slots.Slot, error) {
	return r.acquire(ctx, n, keys, true)
}

func (r *Registry[K]) acquire(ctx context.Context, n int, keys []K, wait bool) (*slots.Slot, error) {
	callerCtx := ctx // for the Observer: none for a TryAcquire
	if !wait {
		callerCtx = nil
	}
	// As the local registry does: a weight out of range is told before a
	// nil context.
	if n != 1 {
		if err := core.CheckUnits(n); err != nil {
			r.stats.rejected.Add(1)
			r.observe(callerCtx, nil, err, 0)
			return nil, err
		}
	}
	if ctx == nil {
		r.observe(nil, nil, slots.ErrNilContext, 0)
		return nil, slots.ErrNilContext
	}
	var start time.Time
	if r.cfg.observer != nil {
		start = time.Now()
	}
	if len(keys) == 0 {
		r.observe(callerCtx, nil, registry.ErrNoKeys, 0)
		return nil, registry.ErrNoKeys
	}
	// Before anything goes to the store, and before dedupe compares them: the
	// local registry's rule, so that the key is refused whether or not
	// the store is reachable.
	for _, k := range keys {
		if err := r.validKey(k); err != nil {
			r.stats.rejected.Add(1)
			r.observe(callerCtx, nil, err, 0)
			return nil, err
		}
	}
	keys = ikeys.Dedupe(keys)
	l := &lease[K]{r: r, id: newLeaseID(), keys: keys, names: make([]string, len(keys)), units: n}
	l.cancel, _ = ctx.Value(cancelKey{}).(context.CancelCauseFunc)
	for i, k := range keys {
		l.names[i] = r.keyName(k)
	}
	s, err := r.admit(ctx, l, wait)
	if err != nil {
		r.stats.rejected.Add(1)
	}
	if r.cfg.observer != nil {
		r.observe(callerCtx, s, err, time.Since(start))
	}
	return s, err
}
