package fleet

import (
	"math"
	"sync"
	"time"

	"github.com/inflight-go/inflight/internal/core"
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
			if h.m == nil {
				h.m = map[string]*keyHold{}
			}
			if len(h.m) >= maxKeyHolds {
				h.evictLocked()
			}
			kh = new(keyHold)
			h.m[name] = kh
		}
		kh.hold.Observe(held)
		kh.used = now
	}
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
// behind the returns told before it here, lead earlier (a caller that may
// queue on its return). It reports false when no hold of the key has ended
// here yet.
func (h *keyHolds) retryAfter(name string, queued, units, limit int, lead time.Duration) (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kh := h.m[name]
	if kh == nil || !kh.hold.Known() || limit <= 0 {
		return 0, false
	}
	lead = min(lead, kh.hold.Mean()/time.Duration(limit)/2)
	return kh.hold.RetryAfter(time.Now().UnixNano(), units, needOf(queued, units), limit, nil, lead, &kh.told), true
}

// refusalRetryAfter is the Retry-After of a caller refused on the key named
// name: from the key's holds (see keyHolds.retryAfter), or cold, fallback.
func (r *Registry[K]) refusalRetryAfter(name string, queued, units, limit int, lead, fallback time.Duration) time.Duration {
	if d, ok := r.holds.retryAfter(name, queued, units, limit, lead); ok {
		return d
	}
	return fallback
}

// needOf is what a caller of units refused behind queued callers in the
// store needs to free (core.HoldTime.RetryAfter), taking the others at a
// unit each (the store counts them, not their units): a reply out of range
// (negative, or so large it would wrap) counts as none, or as many as can
// be said.
func needOf(queued, units int) int { return min(max(queued, 0), math.MaxInt32) + units }
