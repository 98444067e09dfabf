package registry

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

func (r *Registry[K]) withdrawOne(e *entry[K], w *core.Waiter) bool {
	var wk core.Wakes
	sh := e.shard
	sh.mu.Lock()
	// Beside heavy waiters any withdrawal may unblock one: a heavy one
	// stops keeping free units, and a flow that leaves changes whose turn
	// comes first (candidateLocked keeps a heavy waiter's place by arrival).
	serve := r.eng.Shares != nil || e.lane.Waiters.Heavy() > 0
	if serve && e.lane.Multi > 0 {
		// Serving the waiters a withdrawal may unblock takes multiMu.
		sh.mu.Unlock()
		return r.withdrawShared([]*entry[K]{e}, w, nil)
	}
	if !e.lane.Withdraw(w) {
		sh.mu.Unlock()
		return false
	}
	if serve {
		// Its class may have stopped waiting here, and stopped keeping its
		// minimum share from the others; see above for heavy waiters. With
		// no multi-key waiter (Multi stays 0 under this lock) they are all
		// served here.
		r.grantLocked([]*entry[K]{e}, &wk)
	}
	sh.dropIfIdleLocked(r, e)
	sh.mu.Unlock()
	wk.Wake()
	return true
}

func (sh *shard[K]) addLocked(r *Registry[K], key K, hash uint64, limit int) *entry[K] {
	var e *entry[K]
	if sh.spare != nil {
		e, sh.spare = sh.spare, nil
	} else if n := len(sh.free); n > 0 {
		e = sh.free[n-1]
		sh.free[n-1] = nil
		sh.free = sh.free[:n-1]
	} else {
		e = &entry[K]{shard: sh}
	}
	e.key = key
	e.hash = hash
	e.lane.Limit = limit
	e.lane.Shares = r.eng.Shares
	sh.lanes.put(e, hash)
	return e
}

// holdLocked counts h as a holder of e, keeping its place in *idx.
func (sh *shard[K]) holdLocked(r *Registry[K], e *entry[K], h *core.Hold, idx *int32) {
	sh.seq++
	h.ID = sh.seq<<r.shardBits | uint64(sh.idx)
	e.lane.Holders.Add(h, idx)
}

// dropIfIdleLocked removes e once it has neither holders nor waiters, and
// forgets its key's fetched limit unless that is being fetched or still
// retained.
func (sh *shard[K]) dropIfIdleLocked(r *Registry[K], e *entry[K]) {
	key := e.key
	if sh.dropUnusedLocked(e) && sh.resolved != nil {
		if rv, ok := sh.resolved[key]; ok && rv.fetch == nil && !r.retained(rv, r.eng.Clock.Coarse()) {
			delete(sh.resolved, key)
		}
	}
}

// dropUnusedLocked removes e if it has neither holders nor waiters, and
// reports whether it did. Its key's fetched limit stays: as it does for
// an entry made to decide for a caller that was refused, which took nothing.
func (sh *shard[K]) dropUnusedLocked(e *entry[K]) bool {
	if e.lane.Holders.Len() > 0 || e.lane.Waiters.Len() > 0 {
		return false
	}
	sh.lanes.remove(e, e.hash)
	// The lane is empty as it stands (its holder set keeps its capacity for
	// reuse); only the key goes, so that it can be collected.
	var zero K
	e.key = zero
	e.lane.Told = nil // the returns told are the key's
	if sh.spare == nil {
		sh.spare = e
	} else if len(sh.free) < maxFreeEntries {
		sh.free = append(sh.free, e)
	}
	return true
}

// Release implements core.Owner for holds of this key alone; called once
// per hold.
func (e *entry[K]) Release(h *core.Hold) bool {
	sh := e.shard
	r := sh.r
	sh.mu.Lock()
	if e.lane.Multi > 0 {
		// Multi-key waiters queue here: serving them needs multiMu, which
		// comes before this lock. The hold stays counted meanwhile, so no
		// room shows before they can be served.
		sh.mu.Unlock()
		return r.releaseSlow(h, []*entry[K]{e}, nil)
	}
	if !e.lane.Remove(h, &h.Idx) {
		sh.mu.Unlock()
		r.eng.Misuse(h) // a copied Slot: it holds nothing
		return false
	}
	sh.released++
	var wk core.Wakes
	if e.lane.Waiters.Len() > 0 {
		r.grantLocked([]*entry[K]{e}, &wk)
	}
	sh.dropIfIdleLocked(r, e)
	sh.mu.Unlock()
	wk.Wake() // nothing to wake if nobody waits (BenchmarkRegistryTryAcquireRelease)
	r.eng.Released(h)
	return true
}

// Release implements core.Owner for multi-key holds.
func (m *multi[K]) Release(h *core.Hold) bool { return m.r.releaseSlow(h, m.entries, m) }

// releaseSlow frees h's capacity on entries (m describes a multi-key hold),
// serves the waiters that can now be served, multi-key ones included, and
// reports the release; or, for a copied Slot, which holds nothing, the
// misuse, and false.
func (r *Registry[K]) releaseSlow(h *core.Hold, entries []*entry[K], m *multi[K]) bool {
	if !r.freeLocking(h, entries, m) {
		r.eng.Misuse(h) // once the locks are released
		return false
	}
	r.eng.Released(h)
	return true
}

// freeLocking is releaseSlow's part under multiMu and the shards it needs.
func (r *Registry[K]) freeLocking(h *core.Hold, entries []*entry[K], m *multi[K]) bool {
	var wk core.Wakes
	defer wk.Wake() // deferred first, so it runs after every unlock
	r.multiMu.Lock()
	defer r.multiMu.Unlock()
	set, serve := r.lockForGrant(entries, nil)
	defer r.unlockShards(set)
	for i, e := range entries {
		idx := &h.Idx
		if m != nil {
			idx = &m.idx[i]
		}
		if !e.lane.Remove(h, idx) {
			// A copied Slot holds nothing; its first key shows it, and
			// nothing has been removed yet. The caller counts the misuse
			// once the locks are released.
			return false
		}
	}
	entries[0].shard.released++
	r.grantLocked(serve, &wk)
	r.dropIdleLocked(entries)
	return true
}

// Misuse implements core.Owner: a second Release of the same slot.
func (e *entry[K]) Misuse(h *core.Hold) { e.shard.r.eng.Misuse(h) }

// Misuse implements core.Owner.
func (m *multi[K]) Misuse(h *core.Hold) { m.r.eng.Misuse(h) }

// Time implements core.Owner.
func (e *entry[K]) Time(at int64) time.Time { return e.shard.r.eng.Clock.Time(at) }

// Time implements core.Owner.
func (m *multi[K]) Time(at int64) time.Time { return m.r.eng.Clock.Time(at) }

// Log implements core.Owner.
func (e *entry[K]) Log() *slog.Logger { return e.shard.r.eng.Log() }

// Log implements core.Owner.
func (m *multi[K]) Log() *slog.Logger { return m.r.eng.Log() }

// Reclaim implements core.Leaker: it frees a dropped Slot's hold and
// reports the leak. The key is read first, under its shard's lock: the hold
// still counts then, so e is still the key's entry; once freed, e may go
// idle and serve another key.
func (e *entry[K]) Reclaim(t *core.Tracked) {
	e.shard.mu.Lock()
	key := e.key
	e.shard.mu.Unlock()
	e.shard.r.eng.Reclaim(t, slog.String("key", keyString(key)))
}

// Reclaim implements core.Leaker, naming the multi-key slot's first key.
func (m *multi[K]) Reclaim(t *core.Tracked) { m.entries[0].Reclaim(t) }

// rejectLocked builds a rejection for key, from its entry e, of a caller of
// class c weighing n units.
func (r *Registry[K]) rejectLocked(reason error, key K, e *entry[K], n int, c uint8) *core.Rejection {
	if e.lane.Holders.Len() == 0 && e.lane.Waiters.Len() == 0 {
		// An entry made to decide for this caller: no return to book.
		return r.eng.Reject(reason, keyString(key), 0, e.lane.Limit, 0)
	}
	return r.eng.RejectLane(reason, keyString(key), &e.lane, n, c)
}

// keyString formats a key for errors and logs, cut to a readable length.
func keyString[K comparable](key K) string {
	const max = 256
	s, ok := any(key).(string)
	if !ok {
		s = fmt.Sprint(key)
	}
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}
