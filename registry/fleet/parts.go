package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// The parts a Registry is made of (see Registry), each with its state and
// the lock that guards it.

// keyRules are how a Registry names its keys in the store and what limit
// each has unless SetLimit says otherwise. Set by New, read-only after.
type keyRules[K comparable] struct {
	keyName   func(K) string
	defLimit  int
	limitFunc func(K) int // nil: defLimit
}

// limitsSet are the limits SetLimit gave keys; guarded by the Registry's
// mu. limitsPeak is the most entries since the map was last made (see
// remade).
type limitsSet[K comparable] struct {
	limits     map[K]int
	limitsPeak int
}

// queueing is a Registry's part in the fleet's queue (see PROTOCOL.md):
// this process's name in it, the claim window, the liveness TTL, and what
// the wait options say. Set by New (some tests shorten the claim window
// before any call).
type queueing struct {
	proc        string
	claim, live time.Duration
	waitPolicy
}

// refusals is what a Registry's refusals are told: holdTime estimates how
// long holders keep their leases, and holds per key, for the Retry-After
// of a refusal (holdTime for a key none of whose holds has ended here);
// bypassLog spaces the logs of fail-open admissions. Each guards itself.
type refusals struct {
	bypassLog core.Every
	holdTime  core.HoldTime
	holds     keyHolds
}

// losses is what a Registry knows of the store's data: pause is how long
// new admissions wait after the store lost its data, as this process
// declares it; epoch the latest epoch a reply told (0: none yet); lostAt
// when this process last found a data loss, unix nanoseconds (0: never).
// See pause.go.
type losses struct {
	pause  time.Duration // set by New
	epoch  atomic.Int64
	lostAt atomic.Int64
}

// heldLeases are the leases a Registry holds; guarded by its mu.
type heldLeases[K comparable] struct {
	leases map[*lease[K]]struct{}
	// degraded are the leases in leases with degraded set.
	degraded map[*lease[K]]struct{}
	// unmirrored are the units per key of the leases the store admitted
	// that hold no slot in the local registry: it had no room for them (its
	// limit not yet caught up with a raised one, or this process holding
	// leases the store lost). FallbackLocal counts them as held (see
	// fallbackAcquire). A store's admission is counted here from before it
	// tries the local registry until that admits it (see hold).
	unmirrored map[K]int
	// outside are the leases per key admitted outside the store and not
	// in it yet, counted from before their local slot is taken (see hold):
	// a store's admission beside one counts it (outsideMeanwhile).
	outside map[K]int
	// wentIn counts the leases admitted outside the store that have been
	// put into it since (see inStoreLocked): a store's admission decided
	// before one went in did not count it, yet the lease no longer counts
	// in outside (see outsideMeanwhile).
	wentIn uint64
	// The most entries of each map since it was last made (see remade).
	leasesPeak, degradedPeak, unmirroredPeak, outsidePeak int
}

// unmirror counts l, held without a slot in the local registry, on each
// of its keys, or with by -1 no longer.
func (h *heldLeases[K]) unmirror(l *lease[K], by int) {
	h.unmirrored = counted(h.unmirrored, &h.unmirroredPeak, l.keys, by*l.units)
}

// admittedOutside counts l, admitted outside the store, on each of its
// keys, or with by -1 no longer.
func (h *heldLeases[K]) admittedOutside(l *lease[K], by int) {
	h.outside = counted(h.outside, &h.outsidePeak, l.keys, by)
}

// counted adds by to m's count of each of keys, drops the counts that
// reach 0, and returns m, made again if it has shrunk (see remade).
func counted[K comparable](m map[K]int, peak *int, keys []K, by int) map[K]int {
	for _, k := range keys {
		if m[k] += by; m[k] == 0 {
			delete(m, k)
		}
	}
	*peak = max(*peak, len(m))
	return remade(m, peak)
}

// count is the count of a lease being admitted, which hold takes before
// its local slot is tried: among the leases held without a local slot if
// the store admitted it, else among those admitted outside the store.
type count[K comparable] struct {
	r        *Registry[K]
	l        *lease[K]
	degraded bool
	done     bool // undone, or taken over by the recorded lease
}

// counting counts l, as count says.
func (r *Registry[K]) counting(l *lease[K], degraded bool) count[K] {
	r.mu.Lock()
	defer r.mu.Unlock()
	if degraded {
		r.held.admittedOutside(l, 1)
	} else {
		r.held.unmirror(l, 1)
	}
	return count[K]{r: r, l: l, degraded: degraded}
}

// undo takes the count back, once.
func (c *count[K]) undo() {
	if c.done {
		return
	}
	c.done = true
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if c.degraded {
		c.r.held.admittedOutside(c.l, -1)
	} else {
		c.r.held.unmirror(c.l, -1)
	}
}

// waitQueues are a Registry's waiters, guarded by their mu (taken after
// the Registry's mu where both are held, never before). queues are the
// waiters of each key, in order (see waiters.go); queuesPeak is the most
// keys waited on since the map was last made. tickets are the waiters
// that have asked the store (and may be queued there), by the lease id
// they asked under, for their grants' wake-ups; a waiter is in it from
// before its call.
type waitQueues struct {
	mu          sync.Mutex
	queues      map[string][]*waiter
	queuesPeak  int
	tickets     map[string]*waiter
	ticketsPeak int
	waiting     int // callers in the queues
	// unlined counts the waiters in the queues in line (waiter.inLine)
	// that have not taken a place (waiter.waiting): while there are none,
	// blockedOn has none to wake.
	unlined int
}

// learnedCaps are the keys whose caps a Registry learns (see learn.go),
// under a lock of their own: mu guards learning, learnedBy, learnLog
// (changes to log, see toldLocked), closed (Close was called) and every
// learning's fields, and the answered flag of the leases. A learned cap's
// ceiling is its key's limit, which the Registry's mu guards: where both
// are held, the Registry's mu is taken first, and nothing is taken under
// mu but the server clock's. ever (read without mu) tells whether a key was
// ever learned, so that admissions and reports on a Registry that learns
// none never take mu.
// learnKick wakes the learner goroutine, and learnMu (taken before the
// Registry's mu) orders the settings of learned limits in the local
// registry.
type learnedCaps[K comparable] struct {
	mu          sync.Mutex
	learning    map[K]*learning
	learnedBy   map[string]K
	learnLog    []learnChange
	closed      bool
	ever        atomic.Bool
	learnKick   chan struct{}
	learnMu     sync.Mutex
	learnErrLog core.Every // a failed write of a learned state
}

// removalQueue is the removals a Registry has still to send to the store.
type removalQueue[K comparable] struct {
	remMu      sync.Mutex    // protects the fields below
	removals   []*lease[K]   // removals from the store to send, oldest first
	maxPending int           // bound of removals (maxRemovals; tests lower it)
	kick       chan struct{} // buffered 1: removals queued
	resume     chan struct{} // buffered 1: the breaker closed, send the removals again
}

// lifecycle is a Registry's goroutines' signals.
type lifecycle struct {
	subscribed chan struct{} // closed once the store's Listen listens
	recovery   chan struct{} // the breaker closed: the heartbeat puts back the degraded leases
	reassert   chan struct{} // buffered 1: the store lost its data: the heartbeat puts the leases back now
	stop       context.CancelFunc
	done       sync.WaitGroup
	stopping   context.Context
}

// survived counts the panics the background goroutines survived, and
// panicLogged is when one was last logged (Unix ns; see survive).
type survived struct {
	panics      atomic.Uint64
	panicLogged atomic.Int64
}
