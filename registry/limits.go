package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	ikeys "github.com/inflight-go/inflight/internal/keys"
	"github.com/inflight-go/inflight/slots"
)

// SetLimit sets key's limit, overriding the default and the LimitFunc, and
// applies it at once to a live key. Raising it admits waiters at once;
// lowering it never takes capacity from a holder: admissions resume when
// enough holders have released. A negative n is ignored (and logged). The
// override is kept until ClearLimit, also while the key is idle. Set
// while a key's first LimitFunc fetch runs, it takes effect once that
// ends: callers wait for the fetch all the same (a LimitFunc that never
// returns holds them; give it a deadline of its own).
func (r *Registry[K]) SetLimit(key K, n int) {
	if n < 0 {
		r.eng.Log().Warn("registry: SetLimit with a negative limit ignored",
			slog.String("key", keyString(key)), slog.Int("limit", n))
		return
	}
	r.applyLimit(key, func(sh *shard[K]) (int, bool) {
		if sh.overrides == nil {
			sh.overrides = make(map[K]int)
		}
		sh.overrides[key] = n
		return n, true
	})
}

// ClearLimit removes key's SetLimit override: the key goes back to
// its LimitFunc's limit or the default, at once if it is live. A key never
// fetched (overridden from its start) has the default until an acquire
// fetches its limit, also for callers that found the override and make
// the key's lane after it went.
func (r *Registry[K]) ClearLimit(key K) {
	r.applyLimit(key, func(sh *shard[K]) (int, bool) {
		delete(sh.overrides, key)
		return r.limitLocked(sh, key, -1), true
	})
}

// RefreshLimits makes the next admission of every key that match accepts
// fetch its limit from the LimitFunc again, instead of using the one cached:
// for a source of limits that has just changed (an organisation's limit
// edited by an operator, say). Until then the cached limit stays in force.
// It walks the cache one shard at a time. Without a LimitFunc
// (NewWithLimitFunc) it does nothing.
func (r *Registry[K]) RefreshLimits(match func(K) bool) {
	if r.limitFunc == nil {
		return
	}
	r.eachShard(func(sh *shard[K]) {
		for k, rv := range sh.resolved {
			if match(k) {
				rv.at, rv.again = staleAt, rv.fetch != nil
				sh.resolved[k] = rv
			}
		}
	})
}

// staleAt is a fetch time that no refresh interval counts as fresh. The limit
// stays the last known one (a failed fetch keeps it) while its key is live.
const staleAt = math.MinInt64 / 2

// applyLimit runs set with the key's shard locked and applies the limit it
// returns to the key's lane, if the key is live and set reports a change.
// Every lock a raise needs to serve multi-key waiters (multiMu, their shards)
// is taken before anything changes, so no caller can take the new room ahead
// of a waiter that could be served.
func (r *Registry[K]) applyLimit(key K, set func(*shard[K]) (int, bool)) {
	if r.CheckKey(key) != nil {
		return // a key admissions refuse has no limit to set
	}
	sh, hash := r.shardFor(key)
	var wk core.Wakes
	defer wk.Wake() // deferred first, so it runs after every unlock
	r.multiMu.Lock()
	defer r.multiMu.Unlock()
	_, locked, serve := r.lockBeside(sh, key, hash)
	defer r.unlockShards(locked)
	n, ok := set(sh)
	e := sh.lanes.get(key, hash)
	if !ok || e == nil {
		return
	}
	e.lane.Limit = n
	r.refuseOverweightLocked(e, &wk)
	// Served after any change: a lower limit may also let a class pass
	// that a heavy waiter's place held back (core.Lane.Candidate).
	if serve == nil {
		serve = []*entry[K]{e}
	}
	r.grantLocked(serve, &wk)
	sh.dropIfIdleLocked(r, e)
}

// refuseOverweightLocked refuses the waiters of e that weigh more than its
// limit can now admit (core.Lane.Overweight), leaving them in wk to be
// woken. Call under applyLimit's locks: a multi-key waiter's shards are
// among them, and it leaves its other keys' queues too (which may then go
// idle).
func (r *Registry[K]) refuseOverweightLocked(e *entry[K], wk *core.Wakes) {
	for _, w := range e.lane.Overweight(nil) {
		r.exceedsLimit.Add(1)
		if m, ok := w.Hold.Owner.(*multi[K]); ok {
			r.unlinkWaiterLocked(w, m, false)
			m.refusedBy = e.key
			for _, me := range m.entries {
				if me != e {
					me.shard.dropIfIdleLocked(r, me)
				}
			}
		} else {
			e.lane.Waiters.Remove(&w.Elem)
		}
		wk.Refuse(w)
	}
}

// refreshLimit fetches key's limit from the LimitFunc if it is due (see
// NewWithLimitFunc), and returns the limit fetched, or the last known one
// (-1: none), for the caller to start key's lane with should the key's
// record be gone by then (limitLocked). It fails only when ctx ends while
// it waits for another caller's first fetch of the key.
func (r *Registry[K]) refreshLimit(ctx context.Context, sh *shard[K], key K) (int, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	now := r.eng.Clock.Coarse()
	// Once pruneEvery, every shard's cache not pruned since: one
	// whose keys have all gone quiet would otherwise keep their limits.
	if at := r.sweepAt.Load(); now >= at && r.sweepAt.CompareAndSwap(at, now+r.pruneEvery) {
		r.eachShard(func(sh *shard[K]) { r.pruneResolvedLocked(sh, now) })
	}
	sh.mu.Lock()
	r.pruneResolvedLocked(sh, now)
	var rv resolved
	for {
		_, overridden := sh.overrides[key]
		rv = sh.resolved[key]
		// Fresh; or overridden, unless the key's first fetch runs: its
		// callers wait for it all the same, so that no lane is made at
		// the default, should the override go meanwhile (ClearLimit).
		if rv.ok && now-rv.at < int64(r.refresh) || overridden && (rv.fetch == nil || rv.ok) {
			sh.mu.Unlock()
			return rv.known(), nil
		}
		if rv.fetch == nil {
			break
		}
		sh.mu.Unlock() // rv is a copy, and its fetch stays with those waiting for it
		if rv.ok {
			return rv.n, nil // keep using the last known limit meanwhile
		}
		start, left := r.eng.Clock.Nanos(), false
		select {
		case <-rv.fetch.done:
			if !rv.fetch.left { // written before done was closed
				return rv.fetch.n, nil
			}
			// Its caller left: that says nothing of the limit; fetch
			// again, unless this one has left too.
		case <-ctx.Done(): // the caller gave up while queued behind the first fetch
			left = true // (so even a context whose Err lags its Done)
		}
		now = r.eng.Clock.Coarse()
		sh.mu.Lock()
		if left || ctx.Err() != nil {
			sh.st.canceled++
			sh.mu.Unlock()
			return -1, r.eng.Canceled(ctx, time.Duration(r.eng.Clock.Nanos()-start))
		}
	}
	fetch := &fetching{done: make(chan struct{})}
	rv.fetch = fetch
	sh.resolved[key] = rv
	sh.resolvedPeak = max(sh.resolvedPeak, len(sh.resolved))
	sh.mu.Unlock()

	n, gen, err := r.fetchLimit(ctx, sh, key, now, fetch)
	if err != nil {
		if r.limitLog.Allow(now, 10*time.Second) {
			r.eng.Log().Warn("registry: limit lookup failed; keeping the last known limit",
				slog.String("key", keyString(key)), slog.Any("error", err), slog.Bool("known", rv.ok))
		}
		return rv.known(), nil
	}
	r.applyLimit(key, func(sh *shard[K]) (int, bool) {
		// Not over an override, nor once a later fetch has recorded (and
		// applies) its own.
		_, overridden := sh.overrides[key]
		return n, !overridden && sh.resolved[key].gen == gen
	})
	return n, nil
}

// retained reports whether an idle key's cached limit is still worth keeping
// (one marked stale by RefreshLimits is dropped with the key going idle).
func (r *Registry[K]) retained(rv resolved, now int64) bool {
	return rv.ok && rv.at != staleAt && now-rv.at < LimitRetention*int64(r.refresh)
}

// known is rv's limit, if a fetch gave one; else -1.
func (rv resolved) known() int {
	if rv.ok {
		return rv.n
	}
	return -1
}

// fetchLimit calls the LimitFunc and records the outcome. The record is made
// in a deferred call, which turns a panic into an error, so that even a
// LimitFunc that panics or exits its goroutine (runtime.Goexit, as
// t.FailNow does) cannot leave the fetch marked as under way and its
// waiters blocked.
func (r *Registry[K]) fetchLimit(ctx context.Context, sh *shard[K], key K, now int64, fetch *fetching) (n int, gen uint64, err error) {
	n, err = -1, errors.New("registry: LimitFunc did not return")
	defer func() {
		if p := recover(); p != nil {
			n, err = -1, panicError{p}
		}
		sh.mu.Lock()
		rv := sh.resolved[key]
		again := rv.again
		rv.fetch, rv.again = nil, false // a failed fetch leaves it stale
		fetch.n, fetch.left = -1, err != nil && ctx.Err() != nil
		if err == nil {
			rv.n, rv.at, rv.ok = n, now, true
			if again { // fetched anew by the next admission
				rv.at = staleAt
			}
			sh.fetched++ // the shard's, not the record's: a record made anew after a prune starts no count again
			rv.gen, gen = sh.fetched, sh.fetched
			fetch.n = n
		}
		sh.resolved[key] = rv
		sh.mu.Unlock()
		close(fetch.done)
	}()
	n, err = r.limitFunc(ctx, key)
	if err == nil && n < 0 {
		err = fmt.Errorf("registry: LimitFunc returned a negative limit %d", n)
	}
	return n, 0, err
}

type panicError struct{ v any }

func (p panicError) Error() string { return "registry: LimitFunc panicked: " + keyString(p.v) }

// pruneResolvedLocked drops the limits of idle keys that are no longer
// retained: keys that went idle while their limit was retained are
// forgotten here. It runs on an acquire of the shard once pruneEvery has
// passed since the last prune, or once the cache has doubled since then:
// at most one walk of the live keys a second, however short the refresh.
func (r *Registry[K]) pruneResolvedLocked(sh *shard[K], now int64) {
	if len(sh.resolved) < sh.pruneAt && now-sh.prunedAt < r.pruneEvery {
		return
	}
	maps.DeleteFunc(sh.resolved, func(k K, rv resolved) bool {
		_, h := r.shardFor(k)
		return sh.lanes.get(k, h) == nil && rv.fetch == nil && !r.retained(rv, now)
	})
	sh.prunedAt = now
	sh.pruneAt = 2*len(sh.resolved) + 64
	// So that the memory of a burst of keys goes with them.
	sh.resolved = ikeys.Remade(sh.resolved, &sh.resolvedPeak, 0)
}

// Limit returns the limit key has now, or would start with (0 for a key
// unequal to itself or not comparable, which admissions refuse).
func (r *Registry[K]) Limit(key K) int {
	if !r.hashable(key) {
		return 0
	}
	sh, hash := r.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.lanes.get(key, hash); e != nil {
		return e.lane.Limit
	}
	return r.limitLocked(sh, key, -1)
}

// InFlight returns the units key's live holders hold: their number, when
// each weighs one unit.
func (r *Registry[K]) InFlight(key K) int {
	return laneOf(r, key, func(ln *core.Lane) int { return ln.Holders.Units() })
}

// Waiting returns the number of callers waiting on key.
func (r *Registry[K]) Waiting(key K) int {
	return laneOf(r, key, func(ln *core.Lane) int { return ln.Waiters.Len() })
}

// Queue describes the callers waiting on key now: per priority class, and
// the flows with the most waiters.
func (r *Registry[K]) Queue(key K) slots.QueueStats {
	return laneOf(r, key, func(ln *core.Lane) slots.QueueStats {
		return core.QueueStats[slots.QueueStats, slots.FlowStat](&ln.Waiters)
	})
}

// laneOf returns f of key's lane, read under its shard's lock, or f's
// zero value if the key is idle (or unequal to itself, or not comparable).
func laneOf[K comparable, T any](r *Registry[K], key K, f func(*core.Lane) T) (v T) {
	if !r.hashable(key) {
		return v
	}
	sh, hash := r.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.lanes.get(key, hash); e != nil {
		v = f(&e.lane)
	}
	return v
}

// Keys returns the number of keys tracked now: those with a live holder or a
// waiter. Idle keys are not tracked.
func (r *Registry[K]) Keys() int {
	n := 0
	r.eachShard(func(sh *shard[K]) { n += int(sh.lanes.n) })
	return n
}

// Stats are a Registry's counts: the current state and totals since creation.
// A slot admitted under several keys counts once in the totals and once per
// key in InFlight.
type Stats struct {
	InFlight int // units live holders hold, summed over keys
	Waiting  int // waiters, summed over keys
	Keys     int // tracked keys

	Acquired       uint64 // admissions that took capacity
	Waited         uint64 // of Acquired, those that had to wait
	Released       uint64
	Bypassed       uint64 // fail-open admissions without capacity
	LimitReached   uint64 // TryAcquire rejections
	QueueFull      uint64
	ExceedsLimit   uint64 // callers heavier than a key's limit could ever hold (weighted admissions)
	WaitTimeouts   uint64
	Canceled       uint64 // calls whose context ended before a grant (one given back as it came counts as Acquired and Released)
	InvalidKeys    uint64
	DoubleReleases uint64
	Leaked         uint64 // slots dropped while held and reclaimed (WithLeakDetection)
}

// Stats returns the current counts and totals. It locks one shard at a time,
// so the sums are not one instant's, but each shard's part is.
func (r *Registry[K]) Stats() Stats {
	var st Stats
	r.eachShard(func(sh *shard[K]) {
		st.Keys += int(sh.lanes.n)
		sh.lanes.each(func(e *entry[K]) {
			st.InFlight += e.lane.Holders.Units()
			st.Waiting += e.lane.Waiters.Len()
		})
		c := &sh.st
		st.Acquired += sh.seq - c.bypassed
		st.Waited += c.waited
		st.Released += sh.released
		st.Bypassed += c.bypassed
		st.LimitReached += c.limitReached
		st.QueueFull += c.queueFull
		st.WaitTimeouts += c.waitTimeouts
		st.Canceled += c.canceled
	})
	st.InvalidKeys = r.invalidKeys.Load()
	st.ExceedsLimit = r.exceedsLimit.Load()
	st.DoubleReleases = r.eng.Misuses()
	st.Leaked = r.eng.Leaks()
	return st
}

// Holder describes one live holder of one key. A slot admitted under several
// keys appears once per key, with the same ID.
type Holder[K comparable] struct {
	Key        K
	ID         uint64
	AcquiredAt time.Time
	Units      int // the units it holds of the key (see slots.Slot.Units)
}

// Shards returns the number of lock shards, for walking with HoldersInShard.
func (r *Registry[K]) Shards() int { return len(r.shards) }

// HoldersInShard appends the live holders of shard i (0 <= i < Shards()) to
// dst and returns it. It holds only that shard's lock, and only to copy keys,
// ids and raw acquire times (times are converted after unlocking): a sweep
// that walks shard by shard never stops the whole registry, and holds up an
// admission on one shard for about 5 ns per holder of that shard.
func (r *Registry[K]) HoldersInShard(i int, dst []Holder[K]) []Holder[K] {
	sh := &r.shards[i]
	start := len(dst)
	var ats []int64
	sh.mu.Lock()
	sh.lanes.each(func(e *entry[K]) {
		for j := range e.lane.Holders.Len() {
			h := e.lane.Holders.At(j)
			dst = append(dst, Holder[K]{Key: e.key, ID: h.ID, Units: h.Units()})
			ats = append(ats, h.At)
		}
	})
	sh.mu.Unlock()
	for j, at := range ats {
		dst[start+j].AcquiredAt = r.eng.Clock.Time(at)
	}
	return dst
}

// Holders appends every live holder to dst, one shard at a time.
func (r *Registry[K]) Holders(dst []Holder[K]) []Holder[K] {
	for i := range r.shards {
		dst = r.HoldersInShard(i, dst)
	}
	return dst
}
