package registry

import (
	"context"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// The weighted admissions are not exported yet: a heavy waiter beside
// multi-key waiters and flows can still be left waiting while it could be
// served (#30). The engine takes weights; these let the package's tests
// exercise it.

// CachedLimits returns how many LimitFunc results the registry keeps.
func (r *Registry[K]) CachedLimits() int {
	n := 0
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		n += len(sh.resolved)
		sh.mu.Unlock()
	}
	return n
}

// ShardOf returns the index of key's lock shard.
func (r *Registry[K]) ShardOf(key K) int {
	sh, _ := r.shardFor(key)
	return sh.idx
}

// LockShard locks shard i and returns its unlock; it stands in for a
// goroutine that is descheduled while it holds the lock.
func (r *Registry[K]) LockShard(i int) (unlock func()) {
	r.shards[i].mu.Lock()
	return r.shards[i].mu.Unlock
}

// MultiBusy reports whether multiMu is held by someone.
func (r *Registry[K]) MultiBusy() bool {
	if r.multiMu.TryLock() {
		r.multiMu.Unlock()
		return false
	}
	return true
}

// TryAcquireN is TryAcquire for a Slot that weighs n units of key's limit
// (tokens, bytes: what a request costs), all freed by its Release. It fails
// with slots.ErrBadUnits for n out of 1..slots.MaxUnits, and with a
// *slots.LimitError wrapping slots.ErrExceedsLimit if n is more than the
// key's limit can ever admit.
func (r *Registry[K]) TryAcquireN(key K, n int) (*slots.Slot, error) {
	if err := r.checkUnits(nil, n); err != nil {
		return nil, err
	}
	return r.acquireOne(nil, key, n)
}

// AcquireN is Acquire for a Slot that weighs n units of key's limit. As
// with slots.Limiter.AcquireN, order is strict: while it waits for n
// units, later callers of the key do not take them. Besides Acquire's
// failures it fails with slots.ErrBadUnits for n out of
// 1..slots.MaxUnits, and with a *slots.LimitError wrapping
// slots.ErrExceedsLimit if n is more than the key's limit can ever admit:
// at once, or while it waits, when the key's limit is lowered below n (a
// limit of 0 pauses and refuses nobody).
func (r *Registry[K]) AcquireN(ctx context.Context, key K, n int) (*slots.Slot, error) {
	if ctx == nil {
		r.eng.Rejected(nil, slots.ErrNilContext, 0)
		return nil, slots.ErrNilContext
	}
	if err := r.checkUnits(ctx, n); err != nil {
		return nil, err
	}
	return r.acquireOne(ctx, key, n)
}

// TryAcquireAllN is TryAcquireAll for a Slot that weighs n units of every
// key's limit; see AcquireAllN.
func (r *Registry[K]) TryAcquireAllN(n int, keys ...K) (*slots.Slot, error) {
	if err := r.checkUnits(nil, n); err != nil {
		return nil, err
	}
	return r.acquireAll(nil, keys, n)
}

// AcquireAllN is AcquireAll for a Slot that weighs n units of every key's
// limit (a request's tokens under its tenant's, its model's and its
// provider's caps), all freed by its Release. Its failures are AcquireN's,
// the key named being the one that refused; a key whose limit can never
// admit n refuses it at once, or while it waits, once the key's limit is
// lowered below n.
func (r *Registry[K]) AcquireAllN(ctx context.Context, n int, keys ...K) (*slots.Slot, error) {
	if ctx == nil {
		r.eng.Rejected(nil, slots.ErrNilContext, 0)
		return nil, slots.ErrNilContext
	}
	if err := r.checkUnits(ctx, n); err != nil {
		return nil, err
	}
	return r.acquireAll(ctx, keys, n)
}

// checkUnits returns the error for n units out of range (and reports the
// rejection), or nil.
func (r *Registry[K]) checkUnits(ctx context.Context, n int) error {
	err := core.CheckUnits(n)
	if err != nil {
		r.eng.Rejected(ctx, slots.ErrBadUnits, 0)
	}
	return err
}
