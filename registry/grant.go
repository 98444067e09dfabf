package registry

import (
	"math"
	"slices"

	"github.com/inflight-go/inflight/internal/core"
)

func (r *Registry[K]) lockShards(idx []int) {
	for _, i := range idx {
		r.shards[i].mu.Lock()
	}
}

func (r *Registry[K]) unlockShards(idx []int) {
	for _, i := range idx {
		r.shards[i].mu.Unlock()
	}
}

// lockForGrant locks, in ascending order, the shards also, those of entries
// and of every multi-key waiter queued on them, and returns the locked set
// and the entries to serve. Call with multiMu held: it freezes the
// multi-key waiters and how often each has been passed over, so the set
// stays right.
//
// The entries to serve are entries, and every key linked to them through
// multi-key waiters that may hold back the callers of their other keys,
// transitively: with shares, every multi-key waiter (granted through one
// key, it leaves the queues of its other keys, where its class may then stop
// keeping its minimum share); without, those passed over MaxPassed times
// (granted, they stop holding back the callers of their other keys). The
// waiters there must be served in the same pass.
func (r *Registry[K]) lockForGrant(entries []*entry[K], also []int) ([]int, []*entry[K]) {
	set := append(make([]int, 0, 4), also...)
	for _, e := range entries {
		set = append(set, e.shard.idx)
	}
	slices.Sort(set)
	set = slices.Compact(set)
	r.lockShards(set)
	serve := entries
	var in map[*entry[K]]bool // serve's members, once it grows (with shares)
	for {
		need := slices.Clone(set)
		var more []*entry[K]
		for _, e := range serve {
			for el := e.multis.Front(); el != nil; el = el.Next() {
				m := el.Value.Hold.Owner.(*multi[K])
				need = append(need, m.shards...)
				if r.eng.Shares == nil && !m.urgent() && !anyHeavy(m.entries) {
					continue
				}
				if in == nil {
					in = make(map[*entry[K]]bool, len(serve))
					for _, e := range serve {
						in[e] = true
					}
				}
				for _, me := range m.entries {
					if !in[me] {
						in[me] = true
						more = append(more, me)
					}
				}
			}
		}
		slices.Sort(need)
		need = slices.Compact(need)
		if len(need) != len(set) {
			r.unlockShards(set)
			r.lockShards(need)
			set = need
		}
		if len(more) == 0 {
			return set, serve
		}
		// The new keys' shards are in need (a waiter's shards cover all its
		// keys), so they are locked: look at their waiters in turn.
		serve = append(slices.Clip(serve), more...)
	}
}

// grantLocked serves the waiters of entries that can be served now,
// leaving them in wk to be woken after unlocking. Each key's queue gives its
// candidate: the first waiter, in the key's order (class, then flow turns,
// then arrival), that may take a slot of this key and, for a multi-key
// waiter, of every other key it needs. The best candidate over the keys (the
// highest class, then the earliest arrival) is served, and so on while any
// is left. Call with the shards of entries locked and, if any of them has
// multi-key waiters, multiMu and their shards too (lockForGrant).
func (r *Registry[K]) grantLocked(entries []*entry[K], wk *core.Wakes) {
	var now int64
	if len(entries) == 1 && entries[0].lane.Multi == 0 && entries[0].lane.Waiters.Heavy() == 0 {
		e := entries[0]
		for w, passed := e.lane.Candidate(nil); w != nil; w, passed = e.lane.Candidate(nil) {
			if now == 0 {
				now = r.eng.Clock.Coarse()
			}
			r.grantOneLocked(e, w, passed, now, wk)
		}
		return
	}
	for {
		var best, passed *core.Waiter
		var from *entry[K]
		var t turns[K] // each search asks afresh: a grant changes the turns
		for _, e := range entries {
			w, p := r.candidateLocked(e, &t, nil)
			if w != nil && (best == nil || core.Rank(w.Class) < core.Rank(best.Class) ||
				w.Class == best.Class && w.Seq < best.Seq) {
				best, passed, from = w, p, e
			}
		}
		if best == nil {
			return
		}
		if now == 0 {
			now = r.eng.Clock.Coarse()
		}
		m, ok := best.Hold.Owner.(*multi[K])
		if !ok {
			passLocked(from, best.Class, best.Seq, nil)
			r.grantOneLocked(from, best, passed, now, wk)
			continue
		}
		r.unlinkWaiterLocked(best, m, true)
		best.Hold.At = now
		r.holdMultiLocked(best.Hold, m, best.Class, best.Seq)
		m.entries[0].shard.st.waited++
		wk.Grant(best)
	}
}

// candidateLocked returns the waiter of e to serve next, or nil: the
// first in e's order that no older multi-key waiter keeps the slot from
// and that, if it needs other keys too, may take a slot of each (blocking,
// with t caching what the other keys answer during one search).
//
// With turns it serves nobody: it records there the multi-key waiters whose
// turn has come on e, those e's order would serve now if they needed e
// alone: each that nobody keeps the units from and whose units fit, up to
// the first waiter for e alone that weighs more than one unit (it keeps its
// place, fitting or not; past it only classes owed their share go on).
func (r *Registry[K]) candidateLocked(e *entry[K], t *turns[K], turns map[*core.Waiter]bool) (w, passed *core.Waiter) {
	keptFrom := r.keptFromLocked(e)
	return e.lane.Candidate(func(w *core.Waiter, passing bool) bool {
		n := w.Hold.Units()
		if keptFrom != nil && kept(e, keptFrom, w) || blockedLocked(e, w.Class, w.Seq, n) {
			return false
		}
		m, multi := w.Hold.Owner.(*multi[K])
		switch {
		case multi && passing:
			return false // a waiter of several keys passes no blocker
		case turns == nil:
			return !multi || m.blocking(w, n, t) < 0
		case multi:
			turns[w] = n == 1 || e.lane.CanTake(w.Class, n)
			return false
		}
		return n > 1
	})
}

// turns caches, for one search of a grant pass, the turns found on each
// key where a heavy waiter queues (candidateLocked), so that the search
// over q waiters stays linear in q rather than asking each waiter's keys
// anew.
type turns[K comparable] map[*entry[K]]map[*core.Waiter]bool

// come reports whether w's turn has come on e. Call with e's shard held.
func (t *turns[K]) come(e *entry[K], w *core.Waiter) bool {
	if *t == nil {
		*t = make(turns[K])
	}
	if (*t)[e] == nil {
		(*t)[e] = make(map[*core.Waiter]bool)
		e.shard.r.candidateLocked(e, nil, (*t)[e])
	}
	return (*t)[e][w]
}

// keptFromLocked returns, per class, the arrival of the oldest waiter of e
// alone that weighs more than one unit and cannot take its units now,
// once it has been passed up to its bound (Lane.Candidate), or that is
// left out by units kept for an urgent multi-key waiter; nil when there
// is none. Such a waiter keeps its place (see kept). It is found
// over the whole queue, in no particular order, so that whom it holds
// back does not depend on whose turn comes first: a flow that leaves
// changes the turns, never that.
func (r *Registry[K]) keptFromLocked(e *entry[K]) *[core.NumClasses]uint64 {
	if e.lane.Waiters.Heavy() == 0 {
		return nil
	}
	var from *[core.NumClasses]uint64
	for _, c := range core.Order {
		for el := range e.lane.Waiters.Class(c) {
			w := el.Value
			if _, multi := w.Hold.Owner.(*multi[K]); multi || w.Hold.Extra == 0 {
				continue
			}
			n := w.Hold.Units()
			blocked := blockedLocked(e, c, w.Seq, n)
			if !blocked && (e.lane.CanTake(c, n) || w.Passed < core.PassFactor*int64(n)) {
				continue // it fits, or the waiters after it may still pass it
			}
			if from == nil {
				from = &[core.NumClasses]uint64{math.MaxUint64, math.MaxUint64, math.MaxUint64}
			}
			from[c] = min(from[c], w.Seq)
		}
	}
	return from
}

// kept reports whether w must leave e's units to a heavy waiter that keeps
// its place (from, by keptFromLocked): one of its class that came before
// it, or of a higher class, unless w's class is owed its share
// (WithShare). A lower class's never holds back a higher class.
// Past its bound only callers that came before it may pass it, so it
// waits for a bounded set of them, and two waiters that keep units for
// each other (it, and an older multi-key waiter passed over too often)
// cannot hold each other back.
func kept[K comparable](e *entry[K], from *[core.NumClasses]uint64, w *core.Waiter) bool {
	return slices.ContainsFunc(core.Order[:], func(c uint8) bool {
		return w.Seq > from[c] && (c == w.Class || core.Rank(c) < core.Rank(w.Class) && !e.lane.Short(w.Class))
	})
}

// blocking returns the index of the first key of m's waiter w that it may
// not take n units of now, or -1 when it may take every key: room, none
// kept for an urgent multi-key waiter, and no heavy waiter keeping its
// place before w in the key's order (its turn has come, t.come), so that
// every key judges w by its own order, whichever key an event is on.
func (m *multi[K]) blocking(w *core.Waiter, n int, t *turns[K]) int {
	for i, e := range m.entries {
		if !e.lane.CanTake(w.Class, n) || blockedLocked(e, w.Class, w.Seq, n) || e.lane.HeavyAhead(w.Class) && !t.come(e, w) {
			return i
		}
	}
	return -1
}

func (r *Registry[K]) grantOneLocked(e *entry[K], w, passed *core.Waiter, now int64, wk *core.Wakes) {
	e.lane.Serve(w)
	passed.Pass(w, int64(w.Hold.Extra)+1)
	w.Hold.At = now
	e.shard.holdLocked(r, e, w.Hold, &w.Hold.Idx)
	e.shard.st.waited++
	wk.Grant(w)
}
