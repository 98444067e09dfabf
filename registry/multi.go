package registry

import (
	"context"
	"math"
	"slices"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/ilist"
	ikeys "github.com/inflight-go/inflight/internal/keys"
	"github.com/inflight-go/inflight/slots"
)

// multi records the keys of a multi-key admission or waiter, and is the
// Owner of its hold. The waiter's link in the first key's queue is its own
// Elem; the others are here.
type multi[K comparable] struct {
	r       *Registry[K]
	entries []*entry[K] // deduplicated, in the caller's order
	idx     []int32     // the hold's place in each entry's HolderSet
	waits   []ilist.Elem[*core.Waiter]
	links   []ilist.Elem[*core.Waiter] // in each entry's multis
	shards  []int                      // sorted, unique
	// waitKey is the key that holds the waiter back: full when it queued,
	// or the one found as it is withdrawn (withdrawShared);
	// refusedBy, the key that refused it, its limit lowered below what it
	// weighs (refuseOverweightLocked), written before its wake, read after.
	waitKey, refusedBy K
	// passed counts, while it waits, the admissions on its keys that went
	// to callers that came after it (see passLocked), one per admission
	// however many of its keys it took. At MaxPassed each of its keys keeps
	// a slot for it (see blockedLocked). Guarded by multiMu: every
	// admission on a key with multi-key waiters is decided under it.
	passed int
}

// MaxPassed bounds how often a waiting AcquireAll is passed over: once
// MaxPassed admissions on its keys have gone to callers that came after it
// (of its priority class or a lower one), each of its keys keeps a slot for
// it from such callers, so that it is served once all its keys have one.
const MaxPassed = 8

// newcomer is the arrival order of a caller that has not queued: after
// every waiter.
const newcomer = math.MaxUint64

// urgent reports whether m has been passed over MaxPassed times. Call
// with multiMu held.
func (m *multi[K]) urgent() bool { return m.passed >= MaxPassed }

// keeps reports whether m, of class c, keeps units of its keys from later
// callers: it is urgent, and none of its keys is paused for c (a limit of
// 0, or one that higher classes' Reserved take whole: core.Lane.Closed; it
// cannot be served until that is raised, and units kept meanwhile would
// idle its other keys). Call with multiMu held: a queued key's limit
// changes only under it (applyLimit).
func (m *multi[K]) keeps(c uint8) bool {
	return m.urgent() && !slices.ContainsFunc(m.entries, func(e *entry[K]) bool { return e.lane.Closed(c) })
}

// outranks reports whether a multi-key waiter w, on a lane where class c
// is short of its share (WithShare) or not, goes before a later caller of
// class c: if it is of c's class, or of a higher one and the slot is not
// one that c's share owes c.
func outranks(w *core.Waiter, c uint8, short bool) bool {
	return core.Rank(w.Class) == core.Rank(c) || core.Rank(w.Class) < core.Rank(c) && !short
}

// blockedLocked reports whether a caller of class c that arrived at seq,
// weighing n units, must leave the free units of e to older multi-key
// waiters: each one that outranks it and keeps units (passed over MaxPassed
// times, none of its keys paused) keeps its units of e, so the caller may
// take n only if n more are free. Call with multiMu and e's shard held.
func blockedLocked[K comparable](e *entry[K], c uint8, seq uint64, n int) bool {
	if e.lane.Multi == 0 || e.urgent == 0 {
		return false
	}
	short, kept := e.lane.Short(c), 0
	for el := e.multis.Front(); el != nil; el = el.Next() {
		w := el.Value
		if w.Seq < seq && outranks(w, c, short) && w.Hold.Owner.(*multi[K]).keeps(w.Class) {
			kept += w.Hold.Units()
		}
	}
	return kept > 0 && e.lane.Free()-kept < n
}

// heavyAheadLocked reports whether a waiter for e alone weighing more
// than one unit, of class c or a higher one, queues on e: it keeps its
// place (core.Lane.Candidate), so a newcomer of class c may not take e's
// units before it. Call with e's shard held.
func heavyAheadLocked[K comparable](e *entry[K], c uint8) bool {
	if !e.lane.HeavyAhead(c) {
		return false
	}
	for _, d := range core.Order[:core.Rank(c)+1] {
		for el := range e.lane.Waiters.Class(d) {
			if _, multi := el.Value.Hold.Owner.(*multi[K]); el.Value.Hold.Extra > 0 && !multi {
				return true
			}
		}
	}
	return false
}

// passLocked counts an admission on e, of a caller of class c that arrived
// at seq, against the multi-key waiters on e that it passes over (older
// ones that outrank it). counted holds the waiters this admission has
// counted already, on its other keys; it returns counted with those of e
// added. Call with multiMu and e's shard held, before the admission is
// recorded.
func passLocked[K comparable](e *entry[K], c uint8, seq uint64, counted []*core.Waiter) []*core.Waiter {
	if e.lane.Multi == 0 {
		return counted
	}
	short := e.lane.Short(c)
	for el := e.multis.Front(); el != nil; el = el.Next() {
		w := el.Value
		if w.Seq < seq && outranks(w, c, short) && !slices.Contains(counted, w) {
			m := w.Hold.Owner.(*multi[K])
			if m.passed++; m.passed == MaxPassed {
				for _, me := range m.entries {
					me.urgent++ // it keeps units of each of its keys now
				}
			}
			counted = append(counted, w)
		}
	}
	return counted
}

// admitsLocked reports whether a newcomer of class c may take a slot of e
// now. Beside multi-key waiters it must be called under multiMu, with the
// shards of those waiters held and every waiter that can be served served
// (lockBeside): a single-key waiter then queued on e cannot take a slot,
// and neither can a newcomer of its class or a lower one.
func admitsLocked[K comparable](e *entry[K], c uint8, n int) bool {
	if e.lane.Multi == 0 {
		return e.lane.Admits(c, n)
	}
	return e.lane.CanTake(c, n) && !(heavyAheadLocked(e, c) && !e.lane.Short(c)) && !blockedLocked(e, c, newcomer, n)
}

// TryAcquireAll is AcquireAll without waiting: it admits under every key if
// all have room, or fails with a *slots.LimitError naming the first full key.
func (r *Registry[K]) TryAcquireAll(keys ...K) (*slots.Slot, error) {
	return r.acquireAll(nil, keys, 1)
}

// AcquireAll admits one Slot under every key, all or nothing: the Slot holds
// a unit of each key's capacity, and releasing it frees them all. While any
// key is full it waits holding nothing, in arrival order among the callers
// that can be served: callers whose keys are free go ahead of it meanwhile.
// A key listed twice counts once; with no keys it fails with ErrNoKeys.
// Failures are those of Acquire; a *slots.LimitError names the key that was
// full.
//
// Bound: while it waits, callers that came after it, of its priority class or
// a lower one, are admitted on its keys ahead of it at most MaxPassed times
// (an admission that takes several of its keys counts once). From then on each
// of its keys keeps one slot for it: such callers may still take a key's other
// free slots, never the last one, so it is served once every key it needs has
// had a slot free. Waiters that came before it, and callers of a higher class,
// go first as everywhere; a slot that a lower class's share (WithShare) owes
// that class still goes to it. Keys it does not need are never held back, nor
// are any while a key it needs is paused for it (a limit of 0, or one reserved
// whole for higher classes). Several such waiters on one key each keep a slot,
// the oldest served first, so none deadlocks. A TryAcquire that finds only a
// kept slot fails with slots.ErrLimitReached although the key shows room.
func (r *Registry[K]) AcquireAll(ctx context.Context, keys ...K) (*slots.Slot, error) {
	return r.AcquireAllN(ctx, 1, keys...)
}

// TryAcquireAllN is TryAcquireAll for a Slot that weighs n units of every
// key (see AcquireAllN).
func (r *Registry[K]) TryAcquireAllN(n int, keys ...K) (*slots.Slot, error) {
	if err := r.eng.Check(nil, n, false); err != nil {
		return nil, err
	}
	return r.acquireAll(nil, keys, n)
}

// AcquireAllN is AcquireAll for a Slot that weighs n units of every key's
// limit (a request's tokens under its tenant's, its model's and its
// provider's caps), all freed by its Release. It fails as AcquireN does,
// the error naming the key that refused.
func (r *Registry[K]) AcquireAllN(ctx context.Context, n int, keys ...K) (*slots.Slot, error) {
	if err := r.eng.Check(ctx, n, true); err != nil {
		return nil, err
	}
	return r.acquireAll(ctx, keys, n)
}

func (r *Registry[K]) acquireAll(ctx context.Context, keys []K, n int) (*slots.Slot, error) {
	switch len(keys) {
	case 0:
		r.eng.Rejected(ctx, ErrNoKeys, 0)
		return nil, ErrNoKeys
	case 1:
		return r.acquireOne(ctx, keys[0], n)
	}
	for _, k := range keys {
		if err := r.checkKey(ctx, k); err != nil {
			return nil, err
		}
	}
	uniq := ikeys.Dedupe(keys)
	if len(uniq) == 1 {
		return r.acquireOne(ctx, uniq[0], n)
	}
	shs := make([]*shard[K], len(uniq))
	hashes := make([]uint64, len(uniq))
	var fetched []int // the limits each key's refreshLimit resolved
	if r.limitFunc != nil {
		fetched = make([]int, len(uniq))
	}
	for i, k := range uniq {
		shs[i], hashes[i] = r.shardFor(k)
		if r.limitFunc != nil {
			var err error
			if fetched[i], err = r.refreshLimit(ctx, shs[i], k); err != nil {
				return nil, err
			}
		}
	}
	// The record of the admission, the Owner of its hold.
	m := &multi[K]{
		r:       r,
		entries: make([]*entry[K], len(shs)),
		idx:     make([]int32, len(shs)),
	}
	for _, sh := range shs {
		if !slices.Contains(m.shards, sh.idx) {
			m.shards = append(m.shards, sh.idx)
		}
	}
	slices.Sort(m.shards)
	x, h, t := r.eng.Begin(m, n, 1)
	d := r.decideAll(ctx, m, shs, uniq, hashes, fetched, h, n)
	x, err := r.eng.Finish(ctx, x, t, d)
	return (*slots.Slot)(x), err
}

// decideAll takes the locks to decide for a caller of h, weighing n units,
// under the keys of m, decides and releases them. It locks the keys'
// shards (under multiMu) and, if multi-key waiters queue on any of the
// keys, theirs too, and serves what they can take now, as acquireOne does
// for one key (lockBeside), before it decides.
func (r *Registry[K]) decideAll(ctx context.Context, m *multi[K], shs []*shard[K], keys []K, hashes []uint64, fetched []int, h *core.Hold, n int) core.Decision {
	// The class matters to this admission if any key has shares or
	// multi-key waiters; read it here, before the locks.
	var place core.Place
	if ctx != nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	var wk core.Wakes
	defer wk.Wake() // deferred first, so it runs after every unlock
	r.multiMu.Lock()
	defer r.multiMu.Unlock()
	r.lockShards(m.shards)
	set := m.shards
	var beside, serve []*entry[K]
	for i, k := range keys {
		if e := shs[i].lanes.get(k, hashes[i]); e != nil && e.lane.Multi > 0 {
			beside = append(beside, e)
		}
	}
	if beside != nil {
		// Their multi-key waiters leave only under multiMu: they stay live.
		r.unlockShards(set)
		set, serve = r.lockForGrant(beside, set)
		r.grantLocked(serve, &wk)
	}
	defer r.unlockShards(set)
	if core.Ended(ctx) {
		shs[0].st.canceled++
		return core.Cancel()
	}
	// Fill m.entries, making the lanes that do not exist yet at the limits
	// fetched for them (fetched nil: none; see limitLocked). Lanes made
	// here are dropped again if the caller neither holds nor waits.
	for i, k := range keys {
		e := shs[i].lanes.get(k, hashes[i])
		if e == nil {
			f := -1
			if fetched != nil {
				f = fetched[i]
			}
			e = shs[i].addLocked(r, k, hashes[i], r.limitLocked(shs[i], k, f))
		}
		m.entries[i] = e
	}
	full := slices.IndexFunc(m.entries, func(e *entry[K]) bool { return !admitsLocked(e, h.Class, n) })
	if full < 0 {
		r.holdMultiLocked(h, m, h.Class, newcomer)
		if anyHeavy(serve) || anyHeavy(m.entries) {
			r.grantLocked(append(serve, m.entries...), &wk)
		}
		return core.Admit()
	}
	if rej := r.refuseAllLocked(ctx, m, keys, full, h.Class, n, place.Flow); rej != nil {
		for _, e := range m.entries {
			e.shard.dropUnusedLocked(e)
		}
		return core.Refuse(rej)
	}
	w := r.eng.Waiter(h)
	w.Seq = r.waitSeq.Add(1)
	w.Place(place)
	m.waitKey = keys[full]
	queueMultiLocked(m, w)
	if anyHeavy(m.entries) {
		// Beside a heavy waiter a newcomer may queue where it might be
		// served (admitsLocked): serve the queues, in order.
		r.grantLocked(m.entries, &wk)
	}
	return core.Wait(w, m)
}

// anyHeavy reports whether a waiter weighing more than one unit queues on
// any of entries.
func anyHeavy[K comparable](entries []*entry[K]) bool {
	return slices.ContainsFunc(entries, func(e *entry[K]) bool { return e.lane.Waiters.Heavy() > 0 })
}

// refuseAllLocked returns the rejection of a caller of class c weighing n
// units, of flow, that cannot be admitted on every key of m now (full is
// the first that cannot take it) and may not queue either, and counts it;
// or nil. It names a key that can never take it, or else the full key, or
// else the first key from it whose queue is full (so that a bound that
// every queue meets, WithMaxQueue(0), names the full key).
func (r *Registry[K]) refuseAllLocked(ctx context.Context, m *multi[K], keys []K, full int, c uint8, n int, flow string) *core.Rejection {
	first := m.entries[0].shard
	for i, e := range m.entries {
		if n > 1 && e.lane.TooHeavy(c, n) {
			r.exceedsLimit.Add(1)
			return r.rejectLocked(slots.ErrExceedsLimit, keys[i], e, n, c)
		}
	}
	if ctx == nil {
		first.st.limitReached++
		return r.rejectLocked(slots.ErrLimitReached, keys[full], m.entries[full], n, c)
	}
	for j := range keys {
		i := (full + j) % len(keys)
		if e := m.entries[i]; r.eng.Full(&e.lane.Waiters, flow) {
			first.st.queueFull++
			return r.rejectLocked(slots.ErrQueueFull, keys[i], e, n, c)
		}
	}
	return nil
}

// queueMultiLocked queues w, a multi-key waiter, on every key of m.
func queueMultiLocked[K comparable](m *multi[K], w *core.Waiter) {
	links := make([]ilist.Elem[*core.Waiter], 2*len(m.entries)-1)
	m.waits, m.links = links[:len(m.entries)-1], links[len(m.entries)-1:]
	for i, e := range m.entries {
		el := &w.Elem
		if i > 0 {
			el = &m.waits[i-1]
			el.Value = w
		}
		e.lane.Waiters.Push(el)
		e.lane.Multi++
		m.links[i].Value = w
		e.multis.PushBack(&m.links[i])
	}
}

// holdMultiLocked counts h, of a caller of class c that arrived at seq, as
// a holder of every key of m, once it has counted the admission against
// the multi-key waiters it passes over there (passLocked, once per waiter).
func (r *Registry[K]) holdMultiLocked(h *core.Hold, m *multi[K], c uint8, seq uint64) {
	var counted []*core.Waiter
	for _, e := range m.entries {
		counted = passLocked(e, c, seq, counted)
	}
	first := m.entries[0]
	first.shard.holdLocked(r, first, h, &m.idx[0])
	for i, e := range m.entries[1:] {
		e.lane.Holders.Add(h, &m.idx[i+1])
	}
}

// Withdraw implements core.Waits for a multi-key waiter. Its keys may
// then serve others at once: callers it held back once it had been passed
// over too often, and, with shares, those its class kept a minimum from.
func (m *multi[K]) Withdraw(w *core.Waiter) bool { return m.r.withdrawShared(m.entries, w, m) }

// Ended implements core.Waits for a multi-key waiter: counted on its
// first key's shard, answered for the key that refused it or that it
// waited on.
func (m *multi[K]) Ended(w *core.Waiter, out core.Outcome) core.Ending {
	key := m.waitKey
	if out == core.OutRefused {
		key = m.refusedBy
	}
	return m.r.ended(w, out, m.entries[0].shard, key)
}

// withdrawShared withdraws w from entries (m describes a multi-key waiter)
// and serves what that unblocks: with shares, a class that stops waiting
// stops keeping its minimum from the others; a multi-key waiter stops
// holding back callers. The entries are live while w is queued or holds
// them, and w leaves only under multiMu, held here from the start.
func (r *Registry[K]) withdrawShared(entries []*entry[K], w *core.Waiter, m *multi[K]) bool {
	var wk core.Wakes
	defer wk.Wake() // deferred first, so it runs after every unlock
	r.multiMu.Lock()
	defer r.multiMu.Unlock()
	set, serve := r.lockForGrant(entries, nil)
	defer r.unlockShards(set)
	if w.State != core.Waiting {
		return false
	}
	if m != nil {
		// Named by the key that holds it back now: the one full as it
		// queued may have freed since.
		if i := m.blocking(w, w.Hold.Units(), new(turns[K])); i >= 0 {
			m.waitKey = m.entries[i].key
		}
		r.unlinkWaiterLocked(w, m, false)
	} else {
		entries[0].lane.Waiters.Remove(&w.Elem)
	}
	w.State = core.Gone
	r.grantLocked(serve, &wk)
	r.dropIdleLocked(entries)
	return true
}

// dropIdleLocked drops the entries that have neither holders nor waiters.
func (r *Registry[K]) dropIdleLocked(entries []*entry[K]) {
	for _, e := range entries {
		e.shard.dropIfIdleLocked(r, e)
	}
}

// unlinkWaiterLocked takes a multi-key waiter out of its keys' queues:
// served (granted now) or not (it leaves).
func (r *Registry[K]) unlinkWaiterLocked(w *core.Waiter, m *multi[K], served bool) {
	for i, e := range m.entries {
		el := &w.Elem
		if i > 0 {
			el = &m.waits[i-1]
		}
		if served {
			e.lane.Waiters.Served(el)
		} else {
			e.lane.Waiters.Remove(el)
		}
		e.lane.Multi--
		e.multis.Remove(&m.links[i])
		if m.urgent() {
			e.urgent--
		}
	}
}
