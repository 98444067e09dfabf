package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
)

var (
	// ErrUnavailable: the store could not be reached and the Registry fails
	// closed (FailClosed). It comes wrapped in an *UnavailableError, which
	// says when to try again.
	ErrUnavailable = errors.New("fleet: store unavailable")
	// ErrClosed: the Registry was closed.
	ErrClosed = errors.New("fleet: registry closed")
	// ErrLeaseLost: the cause of a context made by WithCancelOnLost, when
	// its holder's lease went missing in the store (with CancelLost).
	ErrLeaseLost = errors.New("fleet: lease lost")
)

type cancelKey struct{}

// WithCancelOnLost returns a context derived from ctx, to acquire with and
// to do the held work under: if the lease of a Slot acquired with it is
// lost (with ReassertLost, the default: it expired and there is no room to
// put it back; with CancelLost: it went missing in the store), the context is
// cancelled with the cause ErrLeaseLost (context.Cause tells). Call cancel
// when the work is done, as with context.WithCancel.
func WithCancelOnLost(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	return context.WithValue(ctx, cancelKey{}, cancel), func() { cancel(context.Canceled) }
}

// Registry caps holders per key across a fleet. Create it with New; the
// zero value is not usable.
type Registry[K comparable] struct {
	store  driver.Store
	local  *registry.Registry[K]
	cfg    config
	prefix string // names the Registry in logs: its store's String, or "fleet"

	// The parts, each with its state (and its lock, or the Registry's mu,
	// as each says):
	keyRules[K]                // how keys are named and limited
	queueing                   // the fleet's queue: this process's name in it, its windows, the wait options
	refusals                   // what refusals are told, and fail-open's log
	losses                     // the store's epochs and data losses (pause.go)
	mu              sync.Mutex // protects closed and the parts that say so
	closed          bool
	limitsSet[K]                   // guarded by mu
	held            heldLeases[K]  // guarded by mu
	waits           waitQueues     // its own lock (after mu, when both are held)
	learned         learnedCaps[K] // its own lock (after mu, when both are held)
	lanes                          // acquire calls on their way or queued
	removalQueue[K]                // its own lock
	storeLink                      // its own locks, or atomics
	stats           counters
	lifecycle
	survived // the panics the background goroutines survived

	holdHook    func() // for tests: called by hold before it records a lease
	releaseHook func() // for tests: called by Release before it frees the local mirror
	fullHook    func() // for tests: called by wait when a try found a key full here, before it records so
}

// storeLink is what the Registry knows of its link to the store.
type storeLink struct {
	// storeMu orders the heartbeat's renewals and the releaser's removals:
	// a lease released while a renewal of it is under way is removed after
	// that renewal, so a renewal cannot put back a released lease. It is
	// held across calls to the store (see chanMutex).
	storeMu chanMutex
	brk     breaker     // whether the store answers (atomics)
	clock   serverClock // the store's, as replies tell it (its own lock)
}

type counters struct {
	acquired, rejected, degraded, bypassed atomic.Uint64
	lost, reasserted, storeErrors, paused  atomic.Uint64
	doubleReleases, removalsDropped        atomic.Uint64
	givenBack                              atomic.Uint64
}

// New returns a Registry of keys capped at defaultLimit holders each
// across the fleet whose processes share store, unless SetLimit says
// otherwise. Keys are named in the store with fmt.Sprint (see NewWithKeys).
// It starts the heartbeat, the releaser and the store's Listen; Close stops
// them. It panics if store is nil or defaultLimit is negative.
func New[K comparable](store driver.Store, defaultLimit int, opts ...Option) *Registry[K] {
	return NewWithKeys(store, defaultLimit, Keys[K]{}, opts...)
}

// Keys are what a Registry needs to know of its key type beyond equality.
// A nil field takes its default.
type Keys[K comparable] struct {
	// Name names a key in the store (default fmt.Sprint). Different keys must
	// get different names: give struct keys a Name.
	Name func(K) string
	// Limit gives the limit of every key that SetLimit has not set
	// (default: the default limit). It is called at each admission, under
	// the Registry's lock, so it must be quick and must not call the
	// Registry. The local registry gets the same limits, asked again at
	// most once a LocalLimitRefresh per key, so that FallbackLocal caps
	// alike.
	Limit func(K) int
}

// LocalLimitRefresh is how often at most the local registry asks
// Keys.Limit again for a key's limit.
const LocalLimitRefresh = time.Second

// NewWithKeys is New with keys' names and limits from keys. A store that
// is a fmt.Stringer names the Registry in its logs ("fleet" otherwise): a
// store that wraps another should pass its String on.
func NewWithKeys[K comparable](store driver.Store, defaultLimit int, keys Keys[K], opts ...Option) *Registry[K] {
	if store == nil {
		panic("fleet: nil store")
	}
	label := "fleet"
	if s, ok := store.(fmt.Stringer); ok {
		label = s.String()
	}
	return newRegistry(store, label, defaultLimit, keys, configOf(opts))
}

func configOf(opts []Option) config {
	cfg := defaults()
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.apply(&cfg)
	}
	return cfg
}

// newRegistry returns a Registry on store, named label in logs.
func newRegistry[K comparable](store driver.Store, label string, defaultLimit int, keys Keys[K], cfg config) *Registry[K] {
	if defaultLimit < 0 {
		panic(fmt.Sprintf("fleet: negative default limit %d", defaultLimit))
	}
	r := &Registry[K]{
		store:     store,
		cfg:       cfg,
		keyRules:  keyRules[K]{keyName: func(k K) string { return fmt.Sprint(k) }, defLimit: defaultLimit},
		prefix:    label,
		limitsSet: limitsSet[K]{limits: map[K]int{}},
		held:      heldLeases[K]{leases: map[*lease[K]]struct{}{}, degraded: map[*lease[K]]struct{}{}, unmirrored: map[K]int{}, outside: map[K]int{}},
		removalQueue: removalQueue[K]{maxPending: maxRemovals, kick: make(chan struct{}, 1),
			resume: make(chan struct{}, 1)},
		storeLink: storeLink{storeMu: make(chanMutex, 1)},
		lifecycle: lifecycle{subscribed: make(chan struct{}), recovery: make(chan struct{}, 1), reassert: make(chan struct{}, 1)},
		lanes:     lanes{calls: calls{max: maxSending}, claims: calls{max: claimSlots(store)}},
	}
	if keys.Name != nil {
		r.keyName = keys.Name
	}
	r.limitFunc = keys.Limit
	// A call must not outlast a third of the TTL: a lease then survives one
	// renewal that fails.
	r.cfg.opTimeout = min(r.cfg.opTimeout, r.cfg.ttl/3)
	r.proc = newLeaseID()[:16]
	r.learned.learnKick = make(chan struct{}, 1)
	r.claim = claimWindow(r.cfg)
	r.live = min(r.cfg.ttl, 5*r.claim)
	r.waitPolicy = waitPolicyOf(cfg.local)
	r.pause = pauseFor(r.cfg)
	local := slices.Clip(cfg.local)
	if cfg.observer != nil {
		local = append(local, slots.WithObserver(quietLocal)) // see observe and lease.Release
	}
	if keys.Limit == nil {
		r.local = registry.New[K](defaultLimit, local...)
	} else {
		limit := func(_ context.Context, k K) (int, error) { return max(keys.Limit(k), 0), nil }
		r.local = registry.NewWithLimitFunc(defaultLimit, limit, LocalLimitRefresh, local...)
	}
	r.brk.threshold = cfg.breakAfter
	r.clock.base = time.Now()
	r.stopping, r.stop = context.WithCancel(context.Background())
	r.done.Add(4)
	go r.heartbeat()
	go r.releaser()
	go r.subscribe()
	go r.learner()
	return r
}

// Local returns the in-process registry that mirrors this process's holders
// (and caps alone while the store is unavailable, with FallbackLocal): watch it
// with sweep and sweep/inflightprom. Acquire through the fleet Registry, not
// through it.
func (r *Registry[K]) Local() *registry.Registry[K] { return r.local }

// Close stops the heartbeat, the releaser and the subscription, after
// removing from the store the leases released so far, and takes this process's
// waiters out of the fleet's queue. Leases still held expire after
// LeaseTTL. Acquire fails with ErrClosed afterwards.
func (r *Registry[K]) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		// A Close under way: return once it is done. A cut pipeline's
		// caller, told ErrClosed before its call is abandoned, may call
		// Close itself.
		r.done.Wait()
		return
	}
	r.closed = true
	r.mu.Unlock()
	r.learned.close()
	r.calls.close()
	r.claims.close()
	r.leaveLiveness()
	r.wakeAll()
	r.stop()
	r.done.Wait()
	r.leaveLiveness() // again: a call on its way may have renewed it
}

// leaveLiveness takes this process out of the fleet's liveness hash: the
// tickets of its waiters left in the queue are dropped when next met, not
// granted to it until its liveness lapses (each waiter also withdraws its
// own as it returns ErrClosed). Best effort, within the call timeout: else
// they lapse.
func (r *Registry[K]) leaveLiveness() {
	if !r.brk.allow() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.opTimeout)
	defer cancel()
	_ = r.store.Leave(ctx, r.proc)
}

// SetLimit sets key's fleet-wide limit (and its local one). Every process
// must set the same limits; each admission sends its process's limits. An
// invalid key (see registry.WithMaxKeyBytes) is ignored, as the local registry
// ignores it.
func (r *Registry[K]) SetLimit(key K, n int) {
	if n < 0 {
		r.cfg.log().Warn("fleet: SetLimit with a negative limit ignored", slog.Int("limit", n))
		return
	}
	if r.validKey(key) != nil {
		return
	}
	r.setLimit(key, n, true)
}

// ClearLimit returns key to the default limit.
func (r *Registry[K]) ClearLimit(key K) {
	if r.validKey(key) != nil {
		return
	}
	r.setLimit(key, 0, false)
}

// setLimit sets key's limit to n, or clears it, here and in the local
// registry (a learned key's, to its learned limit under the new ceiling).
func (r *Registry[K]) setLimit(key K, n int, set bool) {
	if r.setLocal(key, n, set) {
		r.applyLearned(key)
		return
	}
	r.wakeAll()
}

// setLocal records key's limit and, unless it is learned (it reports
// whether it is), sets it in the local registry, in order with a Learn's
// setting of it.
func (r *Registry[K]) setLocal(key K, n int, set bool) (learned bool) {
	r.learned.learnMu.Lock()
	defer r.learned.learnMu.Unlock() // the LimitFunc may panic
	learned = r.setLimitLocked(key, n, set)
	switch {
	case learned:
	case set:
		r.local.SetLimit(key, n)
	default:
		r.local.ClearLimit(key)
	}
	return learned
}

// setLimitLocked records key's limit, and reports whether key is learned.
func (r *Registry[K]) setLimitLocked(key K, n int, set bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock() // the LimitFunc may panic
	if set {
		r.limits[key] = n
		r.limitsPeak = max(r.limitsPeak, len(r.limits))
	} else {
		delete(r.limits, key)
		r.limits = remade(r.limits, &r.limitsPeak)
	}
	return r.reconfigureLocked(key)
}

// Limit returns key's limit (0 for a key admissions refuse with
// registry.ErrInvalidKey).
func (r *Registry[K]) Limit(key K) int {
	if r.validKey(key) != nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.limitLocked(key)
}

func (r *Registry[K]) limitLocked(key K) int {
	n := r.staticLimitLocked(key)
	if r.learned.ever.Load() {
		if l, ok := r.learnedLimit(key); ok {
			return min(n, l)
		}
	}
	return n
}

// staticLimitLocked returns key's limit without learning.
func (r *Registry[K]) staticLimitLocked(key K) int {
	if n, ok := r.limits[key]; ok {
		return n
	}
	if r.limitFunc != nil {
		return max(r.limitFunc(key), 0)
	}
	return r.defLimit
}

// Stats are a fleet Registry's counts since New.
type Stats struct {
	Held           int    // leases this process holds now (degraded ones included)
	Waiting        int    // callers of this process waiting now
	Acquired       uint64 // admissions under the fleet caps
	Rejected       uint64 // admissions refused (limit reached, unavailable, context ended)
	Degraded       uint64 // admissions under the local registry alone (the store unavailable)
	Bypassed       uint64 // fail-open admissions (the store unavailable, or the longest wait passed with slots.WithFailOpen)
	Lost           uint64 // leases found missing in the store by the heartbeat (each once until put back)
	Reasserted     uint64 // leases put back into the store (found missing, or degraded and the store back)
	Paused         uint64 // tries refused while new admissions waited after the store lost its data (each try of a wait)
	StoreErrors    uint64 // failed calls to the store
	DoubleReleases uint64
	// GivenBack are admissions the store made over a learned cap cut while
	// their call was on its way, given back and decided again under the
	// cut (PROTOCOL.md, Learned caps).
	GivenBack uint64
	// RemovalsPending are removals from the store (of released leases, and of
	// abandoned calls' lease ids) waiting to be sent now, or sent again.
	RemovalsPending int
	// RemovalsDropped are removals given up: over the bound of pending
	// ones, or still failing once their lease had expired (for an
	// abandoned lease id, once the calls that may add it are past their
	// deadlines). Their leases expire in the store after at most the lease TTL.
	RemovalsDropped uint64
	BreakerOpen     bool // the store is considered unavailable now
}

// Stats returns the counts.
func (r *Registry[K]) Stats() Stats {
	r.mu.Lock()
	st := Stats{Held: len(r.held.leases)}
	r.mu.Unlock()
	r.waits.mu.Lock()
	st.Waiting = r.waits.waiting
	r.waits.mu.Unlock()
	r.remMu.Lock()
	st.RemovalsPending = len(r.removals)
	r.remMu.Unlock()
	st.RemovalsDropped = r.stats.removalsDropped.Load()
	st.Acquired = r.stats.acquired.Load()
	st.Rejected = r.stats.rejected.Load()
	st.Degraded = r.stats.degraded.Load()
	st.Bypassed = r.stats.bypassed.Load()
	st.Lost = r.stats.lost.Load()
	st.Reasserted = r.stats.reasserted.Load()
	st.GivenBack = r.stats.givenBack.Load()
	st.Paused = r.stats.paused.Load()
	st.StoreErrors = r.stats.storeErrors.Load()
	st.DoubleReleases = r.stats.doubleReleases.Load()
	st.BreakerOpen = r.brk.open()
	return st
}

// InFlight returns key's units in flight across the fleet (its holders,
// when each weighs one), as the store counts them now (expired leases
// excluded), or an error: one wrapping
// registry.ErrInvalidKey for a key that admission refuses (nothing is
// sent), or the store's.
func (r *Registry[K]) InFlight(ctx context.Context, key K) (int, error) {
	if err := r.validKey(key); err != nil {
		return 0, err
	}
	return r.store.Count(ctx, r.keyName(key))
}

// chanMutex is a mutex made of a channel of capacity 1, for a lock held
// across calls to the store: a goroutine waiting on it is durably blocked in a
// testing/synctest bubble (one waiting on a sync.Mutex is not, and would
// stop the bubble's clock while the holder waits for a reply that needs
// it), so that a fleet on a virtual store with latency runs in virtual
// time (TestFleetLearnsAMovingCapVirtual).
type chanMutex chan struct{}

func (m chanMutex) Lock() { m <- struct{}{} }

// lockCtx locks m, unless ctx ends first; it reports whether it did.
func (m chanMutex) lockCtx(ctx context.Context) bool {
	select {
	case m <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// Unlock panics if m is not locked, as sync.Mutex's does.
func (m chanMutex) Unlock() {
	select {
	case <-m:
	default:
		panic("fleet: unlock of unlocked storeMu")
	}
}

// StoreUnavailable reports whether the Registry holds its store
// unavailable now (Stats.BreakerOpen): its calls fail at once until a
// probe gets an answer. Other users of the store (a Budget) may skip it
// meanwhile.
func (r *Registry[K]) StoreUnavailable() bool { return r.brk.open() }

// Unavailable returns, while the Registry holds its store unavailable
// (StoreUnavailable), the *UnavailableError its FailClosed admissions are
// refused with now, what (if not "") told after ErrUnavailable's text;
// else nil. A program that skips other calls to the store meanwhile (a
// Budget's) may answer them with it.
func (r *Registry[K]) Unavailable(what string) error {
	if !r.brk.open() {
		return nil
	}
	if what != "" {
		what = ": " + what
	}
	return r.brk.refusal(r.cfg.probeEvery, what)
}
