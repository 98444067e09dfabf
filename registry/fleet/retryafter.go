package fleet

import (
	"cmp"
	"math"
	"sync"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// keyHolds estimates, per key, how long this process's holders keep their
// leases, and keeps the returns told to the callers refused on each key,
// for the Retry-After of a refusal: from the key's own holds (a fast key's
// holds do not tell a slow key's callers), and spread, so that callers
// refused together come back one after another as slots free rather than
// together. The store's queue is not known here, so the spreading is this
// process's: the other processes spread their own.
type keyHolds struct {
	mu sync.Mutex
	m  map[string]*keyHold // by key name; at most maxKeyHolds
}

// keyHold is one key's estimate and the returns told on it.
type keyHold struct {
	hold core.HoldTime
	told core.Told // guarded by keyHolds.mu
	used int64     // when a hold of it last ended, unix nanoseconds; guarded by keyHolds.mu
}

// maxKeyHolds bounds the keys estimated: past it, the estimate of a key
// whose holds ended longest ago, of evictSample keys looked at, is dropped
// for each new one (a key dropped answers as before any hold ended, until
// one does). Each key's told returns are bounded too (core.HoldTime's
// rounds), and given back once due.
const (
	maxKeyHolds = 1024
	evictSample = 8
)

// maxElsewhere bounds the returns taken to be told elsewhere for each one
// told here (core.Told.Elsewhere): a key shared evenly by up to four
// processes is counted whole. A process that holds little of a key (its
// callers refused, say) would otherwise book each return as many times
// over as its share is small, reach the bound of the returns told within
// a few refusals, and tell every caller after them the same time.
const maxElsewhere = 3

// refusedAge is how long ago a key refused here, none of whose holds has
// ended here, is taken to have been used, for evictLocked: it goes before
// the keys whose holds ended within that time, and after the keys refused
// longer ago.
const refusedAge = 24 * time.Hour

// observe folds a hold of held nanoseconds into the estimates of the keys
// named names.
func (h *keyHolds) observe(names []string, held int64) {
	if held < 0 {
		return
	}
	now := time.Now().UnixNano()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, name := range names {
		kh := h.m[name]
		if kh == nil {
			kh = h.addLocked(name, now)
		}
		kh.hold.Observe(held)
		kh.used = now
	}
}

// addLocked adds the key named name, used at now, dropping another past
// maxKeyHolds.
func (h *keyHolds) addLocked(name string, now int64) *keyHold {
	if h.m == nil {
		h.m = map[string]*keyHold{}
	}
	if len(h.m) >= maxKeyHolds {
		h.evictLocked()
	}
	kh := &keyHold{used: now}
	h.m[name] = kh
	return kh
}

// evictLocked drops, of a few keys (the map's order picks them), the one
// whose holds ended longest ago: a key in use stays, one that came once
// goes.
func (h *keyHolds) evictLocked() {
	var drop string
	oldest, n := int64(math.MaxInt64), 0
	for name, kh := range h.m {
		if kh.used < oldest {
			drop, oldest = name, kh.used
		}
		if n++; n == evictSample {
			break
		}
	}
	delete(h.m, drop)
}

// retryAfter is the Retry-After of a caller of units refused on the key
// named name, with queued callers ahead of it in the store, under limit:
// when the units it needs are expected to free, from the key's holds,
// behind the returns told before it, lead earlier (a caller that may
// queue on its return). The store's queue is the fleet's, but the returns
// told are this process's: the other processes tell their own callers of
// the same frees, and are taken to tell as many per unit held as this one
// does, which holds mine of the key's held units. While no hold of the key
// has ended here, cold estimates them, and the return is booked all the
// same, so that callers refused together at the start are spread too
// (see refusedAge for when such an entry is dropped); with cold nil it
// reports false then. Nothing frees before from has passed (a pause):
// the return is estimated, and booked, as if refused then. Rounded up to
// the millisecond; at most core.MaxRetryAfter, or from and a millisecond.
func (h *keyHolds) retryAfter(name string, queued, units, limit, mine, held int, lead, from time.Duration, cold *core.HoldTime) (time.Duration, bool) {
	if limit <= 0 {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	kh := h.m[name]
	est := cold
	switch {
	case kh != nil && kh.hold.Known():
		est = &kh.hold
	case cold == nil:
		return 0, false
	case kh == nil:
		kh = h.addLocked(name, 0)
	}
	if !kh.hold.Known() { // used as by a hold that ended a day ago: it goes before those of keys held
		kh.used = time.Now().Add(-refusedAge).UnixNano()
	}
	kh.told.Elsewhere = min(max(float64(held)/float64(max(mine, 1))-1, 0), maxElsewhere)
	lead = min(lead, cmp.Or(est.Mean(), time.Second)/time.Duration(limit)/2)
	// Rounded up to the millisecond, as the estimate is (a waiter's from
	// is a pause's end less the time now, to the nanosecond), and within
	// MaxRetryAfter, unless the pause itself is longer.
	from = (max(from, 0) + time.Millisecond - 1).Truncate(time.Millisecond)
	d := est.RetryAfter(time.Now().Add(from).UnixNano(), units, needOf(queued, units), limit, nil, lead, &kh.told)
	return min(from+d, max(core.MaxRetryAfter, from+time.Millisecond)), true
}

// refusalRetryAfter is the Retry-After of le, a refusal of l on its key i
// with queued callers ahead of it in the store, nothing freeing before
// from has passed: from the key's holds (see keyHolds.retryAfter), or,
// while none has ended here, from this Registry's with cold set, else
// le's.
func (r *Registry[K]) refusalRetryAfter(l *lease[K], i int, le *slots.LimitError, queued int, lead, from time.Duration, cold bool) time.Duration {
	var est *core.HoldTime
	if cold {
		est = &r.holdTime
	}
	if d, ok := r.holds.retryAfter(l.names[i], queued, l.units, le.Limit, r.local.InFlight(l.keys[i]), le.InFlight, lead, from, est); ok {
		return d
	}
	return le.RetryAfter
}

// needOf is what a caller of units refused behind queued callers in the
// store needs to free (core.HoldTime.RetryAfter), taking the others at a
// unit each (the store counts them, not their units): a reply out of range
// (negative, or so large it would wrap) counts as none, or as many as can
// be said.
func needOf(queued, units int) int { return min(max(queued, 0), math.MaxInt32) + units }
