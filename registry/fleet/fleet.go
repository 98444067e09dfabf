// Package fleet caps how many requests are in flight per key across every
// process of a fleet, with leases in Redis.
//
// An upstream's concurrency limit is per account, not per process: with R
// gateway replicas each capping at N, the provider sees up to R×N. A fleet
// Registry holds one cap per key for all of them. It offers the registry
// admission contract (TryAcquire, Acquire, AcquireAll, TryAcquireAll, each
// returning a *slots.Slot) and keeps a local registry.Registry beside it that
// mirrors this process's holders, for sweeps, metrics and Stats.
//
// # Leases
//
// Each capped key is a Redis sorted set of leases: member = a random 128-bit
// lease id, score = its expiry on the Redis server's clock. One script call
// per admission drops expired leases, checks every key's limit and adds the
// lease to all of them, or to none; a retried call with the same lease id
// takes nothing twice. Limits are sent with each call, so they live in the
// process: SetLimit takes effect at the next admission. Admissions made at
// the same time share round trips: while calls are on their way to Redis,
// later ones queue and then go together as one pipeline (one write and one
// read for many), each still its own script call. An admission alone
// sends its call at once.
//
// A lease does not expire under a live holder: one heartbeat goroutine per
// Registry renews every held lease each LeaseTTL/3, in batched calls, each
// bounded by the call timeout (at most LeaseTTL/3), so one renewal may fail
// and the next still comes in time. Renewal extends only leases that still
// exist; what it does with a lease found missing is told below (Lost
// leases). A process that dies holding leases frees them when they expire,
// after at most LeaseTTL. A key expires in Redis with its latest lease, so
// processes with different LeaseTTLs (a rolling deploy that changes it) may
// share keys. The heartbeat and the releaser survive a panic in a client
// hook or a log handler: it is logged (at most once a minute), and they go
// on as after a failed call.
//
// Keys are checked before anything goes to Redis, by the local registry's
// rule (WithMaxKeyBytes): a key refused with registry.ErrInvalidKey is
// refused whether Redis is reachable or not, and by InFlight too. A caller
// whose context ends before its admission is recorded is not admitted, even
// if Redis admitted its lease: the lease is given back, and the caller gets
// the context's error.
//
// An acquire call that fails on the client's side (a timeout, the caller's
// context) may still run on the server, however late (a stalled server
// runs the calls waiting in its sockets when it resumes); its lease id is
// then abandoned: the lease is removed and a tombstone keeps a late call
// from adding it. So that no call runs very late, each call that may add a
// lease carries a deadline on the server's clock, which the client
// estimates from earlier replies: twice the call timeout after it is made.
// Past it the script refuses to run, and changes nothing.
//
// While Redis is healthy the cap is never exceeded: the script decides and
// records atomically. It can be exceeded by design in two cases, both until
// enough holders release: after Redis loses its data (a restart without
// persistence), new admissions fill the empty keys while the next renewal
// (within LeaseTTL/3) puts the old leases back, up to about twice the cap;
// and with FallbackLocal, during an outage each process admits up to the
// cap alone (R processes: up to R times the cap), and those leases are put
// back when Redis returns (see When Redis is unreachable).
//
// Release frees the local mirror and queues the removal of the lease from
// every key (with a wake-up published) for a background goroutine: it never
// waits for Redis, even while Redis hangs. A removal that fails is sent
// again with backoff (and as soon as the breaker closes) until it succeeds
// or its lease has expired. At most 65,536 removals wait at once; past that
// the oldest is dropped (Stats.RemovalsDropped) and its lease expires after
// at most LeaseTTL. An abandon is given up only once the calls that may add
// its lease id are past their deadlines (and, past the bound, if they were
// made before any reply told the server's clock). A second Release does
// nothing.
//
// # Lost leases
//
// A held lease can go missing from Redis in two ways, told apart by an
// epoch: a key per Registry name (<prefix>{<name>}#epoch, never a key
// name's) with no expiry, set by the first script that finds it missing to
// the server's time. A Registry records with each lease the epoch under
// which it last saw the lease in Redis. If the epoch is another now, Redis
// lost its data since (a restart without persistence, a failover to a
// replica without it, FLUSHALL): the holder is still working, so the lease
// is put back without a cap check (WithLostLeases(ReassertLost), the
// default). If the epoch is the same, the lease expired: its holder did
// not renew it in time (a process stopped or starved for longer than the
// TTL, renewals that kept failing) and others may have taken its place, so
// it goes back only if every key it is missing from has room; if one has
// not, it is lost: counted (Stats.Lost), logged, and the holder's context
// made by WithCancelOnLost is cancelled with the cause ErrLeaseLost, while
// later renewals try again, with the same check. A failover to a replica
// that had the epoch but not the lease, or a restart from a snapshot taken
// before the lease, looks like an expiry. With ReportLost a missing lease
// is only reported, and with CancelLost the holder's context is cancelled
// too; neither puts it back.
//
// # Waiting
//
// Acquire polls with jittered backoff, never sleeping past the earliest
// lease expiry the script reported or the context's deadline, and wakes early
// on a release anywhere in the fleet (Redis pub/sub; a hint only, the polling
// stays). Within one process, waiters go by priority class
// (slots.WithPriority), then in arrival order, per key: a waiter blocked on
// a full key goes before the waiters behind it on that key, and holds back
// no waiter on other keys. The order is strict, per key and from a
// waiter's arrival on: while a higher class keeps waiters held up by a key
// in this process, a lower one does not try for it (a call already on its
// way to Redis is not called back). Flows and shares (slots.WithFlow,
// WithShare) do not apply to these waits, and processes do not order their
// waiters among each other: each tries when its turn in its own process
// comes.
//
// # When Redis is unreachable
//
// A breaker opens after consecutive failures (WithBreaker), so that while
// Redis is down an admission costs no round trip; a background probe puts
// the leases taken meanwhile into Redis and closes it again. An admission
// whose call fails, and every admission while the breaker is open, does
// what WithUnavailable says: FallbackLocal (the default) admits under this
// process's local registry alone, with the same limits, and the Slot
// reports Degraded. FailClosed fails with ErrUnavailable. FailOpen admits a
// Bypassed, Degraded Slot that holds nothing.
//
// A Degraded lease is put into Redis, without a cap check, once Redis
// answers, and counts against this process's admissions from then on: the
// next admission's script call carries in the Degraded leases that share a
// key with it (up to 256 (key, lease) pairs; the heartbeat takes the rest
// moments later) before it decides, and the heartbeat puts them all in
// within the probe interval (WithBreaker), also when the breaker never
// opened. Until then, other processes do not count them.
//
// Give the client short timeouts so that a dead Redis fails fast, and let
// it honour each call's deadline (ContextTimeoutEnabled; without it the
// client's own timeouts bound the calls, not WithTimeout):
//
//	redis.NewClient(&redis.Options{
//		Addr:                  "127.0.0.1:6379",
//		DialTimeout:           250 * time.Millisecond,
//		ReadTimeout:           250 * time.Millisecond,
//		WriteTimeout:          250 * time.Millisecond,
//		ContextTimeoutEnabled: true, // honour each call's context deadline
//		MaxRetries:            1,
//		Protocol:              2, // RESP3's push notifications cost a check per call
//	})
//
// Every key of a Registry shares one Redis Cluster hash tag, its name, so
// any AcquireAll runs as one script on Redis Cluster; all of a Registry's
// keys live on one node of the cluster. Keys are named with fmt.Sprint
// unless WithKeyName says otherwise: give struct keys a name function, so
// that different keys cannot share a name.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

var (
	// ErrUnavailable: Redis could not be reached and the Registry fails
	// closed (FailClosed).
	ErrUnavailable = errors.New("fleet: redis unavailable")
	// ErrClosed: the Registry was closed.
	ErrClosed = errors.New("fleet: registry closed")
	// ErrLeaseLost: the cause of a context made by WithCancelOnLost, when
	// its holder's lease went missing in Redis (with CancelLost).
	ErrLeaseLost = errors.New("fleet: lease lost")
)

type cancelKey struct{}

// WithCancelOnLost returns a context derived from ctx, to acquire with and
// to do the held work under: if the lease of a Slot acquired with it is
// lost (with ReassertLost, the default: it expired and there is no room to
// put it back; with CancelLost: it went missing in Redis), the context is
// cancelled with the cause ErrLeaseLost (context.Cause tells). Call cancel
// when the work is done, as with context.WithCancel.
func WithCancelOnLost(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	return context.WithValue(ctx, cancelKey{}, cancel), func() { cancel(context.Canceled) }
}

// Registry caps holders per key across a fleet. Create it with New; the
// zero value is not usable.
type Registry[K comparable] struct {
	rdb       redis.UniversalClient
	local     *registry.Registry[K]
	cfg       config
	keyName   func(K) string
	prefix    string // "<prefix>{<name>}:"
	channel   string // wake-ups
	defLimit  int
	limitFunc func(K) int // nil: defLimit

	epochKey string // see scripts.go

	mu     sync.Mutex // protects the fields below
	limits map[K]int  // SetLimit overrides
	leases map[*lease[K]]struct{}
	// degraded are the leases in leases with degraded set.
	degraded map[*lease[K]]struct{}
	// The most entries of each map since it was last made (see remade).
	leasesPeak, limitsPeak, degradedPeak int
	// queues are the waiters of each Redis key, in order (see waiting.go);
	// queuesPeak is the most keys waited on since the map was last made.
	queues     map[string][]*waiter
	queuesPeak int
	waiting    int // callers in the queues
	closed     bool
	calls      calls // acquire calls on their way or queued

	remMu      sync.Mutex    // protects the fields below
	removals   []*lease[K]   // removals from Redis to send, oldest first
	maxPending int           // bound of removals (maxRemovals; tests lower it)
	kick       chan struct{} // buffered 1: removals queued
	resume     chan struct{} // buffered 1: the breaker closed, send the removals again

	// redisMu orders the heartbeat's renewals and the releaser's removals:
	// a lease released while a renewal of it is under way is removed after
	// that renewal, so a renewal cannot put back a released lease.
	redisMu sync.Mutex

	brk        breaker
	clock      serverClock // the Redis server's, as replies tell it
	stats      counters
	subscribed chan struct{} // closed once Redis confirms the wake-up subscription
	recovery   chan struct{} // the breaker closed: the heartbeat puts back the degraded leases
	stop       context.CancelFunc
	done       sync.WaitGroup
	stopping   context.Context

	// panics counts the panics the background goroutines survived, and
	// panicLogged is when one was last logged (Unix ns; see survive).
	panics      atomic.Uint64
	panicLogged atomic.Int64
}

type counters struct {
	acquired, rejected, degraded, bypassed atomic.Uint64
	lost, reasserted, redisErrors          atomic.Uint64
	doubleReleases, removalsDropped        atomic.Uint64
}

// New returns a Registry of keys capped at defaultLimit holders each, fleet
// wide, unless SetLimit says otherwise; name tells this Registry's keys from
// others' in the same Redis (every process of a fleet uses the same name).
// It starts the heartbeat, the releaser and the wake-up subscription; Close
// stops them. It panics if defaultLimit is negative or name is empty.
func New[K comparable](rdb redis.UniversalClient, name string, defaultLimit int, opts ...Option) *Registry[K] {
	if defaultLimit < 0 {
		panic(fmt.Sprintf("fleet: negative default limit %d", defaultLimit))
	}
	if name == "" || strings.ContainsAny(name, "{}") {
		panic(fmt.Sprintf("fleet: registry name %q: need a non-empty name without braces", name))
	}

	if rdb == nil {
		panic("fleet: nil redis client")
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	if strings.ContainsAny(cfg.prefix, "{}") {
		panic(fmt.Sprintf("fleet: prefix %q: braces would change the keys' hash tag", cfg.prefix))
	}
	r := &Registry[K]{
		rdb:      rdb,
		cfg:      cfg,
		keyName:  func(k K) string { return fmt.Sprint(k) },
		prefix:   cfg.prefix + "{" + name + "}:",
		defLimit: defaultLimit,
		limits:   map[K]int{},
		leases:   map[*lease[K]]struct{}{},
		degraded: map[*lease[K]]struct{}{},

		maxPending: maxRemovals,
		kick:       make(chan struct{}, 1),
		resume:     make(chan struct{}, 1),
		subscribed: make(chan struct{}),
		recovery:   make(chan struct{}, 1),
		calls:      calls{max: maxSending},
	}
	if f, ok := cfg.keyName.(func(K) string); ok {
		r.keyName = f
	} else if cfg.keyName != nil {
		panic(fmt.Sprintf("fleet: WithKeyName needs a func(%T) string", *new(K)))
	}
	if f, ok := cfg.limitFunc.(func(K) int); ok {
		r.limitFunc = f
	} else if cfg.limitFunc != nil {
		panic(fmt.Sprintf("fleet: WithLimitFunc needs a func(%T) int", *new(K)))
	}
	// A call must not outlast a third of the TTL: a lease then survives one
	// renewal that fails.
	r.cfg.opTimeout = min(r.cfg.opTimeout, r.cfg.ttl/3)
	r.channel = r.prefix + "released"
	r.epochKey = cfg.prefix + "{" + name + "}#epoch"
	// The same key rule on both paths: the fleet's bound goes last, so it
	// overrides one among the local options.
	local := append(slices.Clip(cfg.local), registry.WithMaxKeyBytes(cfg.maxKeyBytes))
	r.local = registry.New[K](defaultLimit, local...)
	r.brk.threshold = cfg.breakAfter
	r.clock.base = time.Now()
	r.stopping, r.stop = context.WithCancel(context.Background())
	r.done.Add(3)
	go r.heartbeat()
	go r.releaser()
	go r.subscribe()
	return r
}

// Local returns the in-process registry that mirrors this process's holders
// (and caps alone while Redis is unavailable, with FallbackLocal): watch it
// with sweep and sweep/inflightprom. Acquire through the fleet Registry, not
// through it.
func (r *Registry[K]) Local() *registry.Registry[K] { return r.local }

// Close stops the heartbeat, the releaser and the subscription, after
// removing from Redis the leases released so far. Leases still held expire
// after LeaseTTL. Acquire fails with ErrClosed afterwards.
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
	r.calls.close()
	r.wakeAll()
	r.stop()
	r.done.Wait()
}

// SetLimit sets key's fleet-wide limit (and its local one). Every process
// must set the same limits; each admission sends its process's limits. An
// invalid key (see WithMaxKeyBytes) is ignored, as the local registry
// ignores it.
func (r *Registry[K]) SetLimit(key K, n int) {
	if n < 0 {
		r.cfg.log().Warn("fleet: SetLimit with a negative limit ignored", slog.Int("limit", n))
		return
	}
	if r.validKey(key) != nil {
		return
	}
	r.mu.Lock()
	r.limits[key] = n
	r.limitsPeak = max(r.limitsPeak, len(r.limits))
	r.mu.Unlock()
	r.local.SetLimit(key, n)
	r.wakeAll()
}

// ClearLimit returns key to the default limit.
func (r *Registry[K]) ClearLimit(key K) {
	if r.validKey(key) != nil {
		return
	}
	r.mu.Lock()
	delete(r.limits, key)
	r.limits = remade(r.limits, &r.limitsPeak)
	r.mu.Unlock()
	r.local.ClearLimit(key)
	r.wakeAll()
}

// Limit returns key's limit.
func (r *Registry[K]) Limit(key K) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.limitLocked(key)
}

func (r *Registry[K]) limitLocked(key K) int {
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
	Degraded       uint64 // admissions under the local registry alone (Redis unavailable)
	Bypassed       uint64 // fail-open admissions (Redis unavailable)
	Lost           uint64 // leases found missing in Redis by the heartbeat (each once until put back)
	Reasserted     uint64 // leases put back into Redis (found missing, or degraded and Redis back)
	RedisErrors    uint64 // failed calls to Redis
	DoubleReleases uint64
	// RemovalsPending are removals from Redis (of released leases, and of
	// abandoned calls' lease ids) waiting to be sent now, or sent again.
	RemovalsPending int
	// RemovalsDropped are removals given up: over the bound of pending
	// ones, or still failing once their lease had expired (for an
	// abandoned lease id, once the calls that may add it are past their
	// deadlines). Their leases expire in Redis after at most the lease TTL.
	RemovalsDropped uint64
	BreakerOpen     bool // Redis is considered unavailable now
}

// Stats returns the counts.
func (r *Registry[K]) Stats() Stats {
	r.mu.Lock()
	st := Stats{Held: len(r.leases), Waiting: r.waiting}
	r.mu.Unlock()
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
	st.RedisErrors = r.stats.redisErrors.Load()
	st.DoubleReleases = r.stats.doubleReleases.Load()
	st.BreakerOpen = r.brk.open()
	return st
}

// InFlight returns key's holders across the fleet, as Redis counts them now
// (expired leases excluded), or an error: one wrapping
// registry.ErrInvalidKey for a key that admission refuses (nothing is
// sent), or Redis's.
func (r *Registry[K]) InFlight(ctx context.Context, key K) (int, error) {
	if err := r.validKey(key); err != nil {
		return 0, err
	}
	k := r.prefix + r.keyName(key)
	now, err := r.rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	n, err := r.rdb.ZCount(ctx, k, "("+strconv.FormatInt(now.UnixMilli(), 10), "+inf").Result()
	return int(n), err
}

// TryAcquire admits under key if it has room across the fleet, without
// waiting. It fails with a *slots.LimitError wrapping slots.ErrLimitReached,
// ErrUnavailable (FailClosed, Redis unreachable), or an error wrapping
// registry.ErrInvalidKey (see WithMaxKeyBytes).
func (r *Registry[K]) TryAcquire(key K) (*slots.Slot, error) {
	return r.acquire(context.Background(), []K{key}, false)
}

// TryAcquireAll admits under every key at once, all or nothing, without
// waiting.
func (r *Registry[K]) TryAcquireAll(keys ...K) (*slots.Slot, error) {
	return r.acquire(context.Background(), keys, false)
}

// Acquire admits under key, waiting while it is full across the fleet (see
// the package documentation), until ctx ends.
func (r *Registry[K]) Acquire(ctx context.Context, key K) (*slots.Slot, error) {
	return r.acquire(ctx, []K{key}, true)
}

// AcquireAll admits under every key at once, all or nothing, waiting while
// any is full. A key listed twice counts once; no keys fail with
// registry.ErrNoKeys. A *slots.LimitError names a key that was full, by its
// name in Redis (WithKeyName), whether Redis or the local registry alone
// decided.
func (r *Registry[K]) AcquireAll(ctx context.Context, keys ...K) (*slots.Slot, error) {
	return r.acquire(ctx, keys, true)
}

// lease is one admission's record: its Redis keys and id, and the Owner of
// its Slot's hold.
type lease[K comparable] struct {
	r        *Registry[K]
	id       string
	keys     []K
	names    []string    // the Redis keys
	limits   []int       // their limits at the admission
	local    *slots.Slot // the mirror in the local registry; nil for a bypass
	hold     *core.Hold  // the Slot's own hold: a copy of the Slot frees nothing
	degraded bool        // not in Redis yet: admitted while Redis was unavailable (guarded by r.mu)
	reported bool        // found missing and reported lost; guarded by r.mu
	// sent: a call that may put it (back) into Redis was made, and may still
	// run: a release abandons it (with a tombstone) rather than just
	// removing it. Guarded by r.mu; never cleared.
	sent bool
	// epoch is the epoch under which it was last seen in Redis (0: not
	// known to be there), for the renewal to tell a lease Redis lost from
	// one that expired (see scripts.go). Guarded by r.mu.
	epoch int64

	// until is the latest not-after time (see clock.go) of the calls made
	// that may add it to Redis under its id: before it, a call that failed
	// may still run. Guarded by r.mu once the lease is held.
	until int64

	abandoned bool                    // a stand-in for a failed call's id, to be taken back (abandonScript)
	since     time.Time               // when its removal was first queued (guarded by r.remMu)
	cancel    context.CancelCauseFunc // from WithCancelOnLost; nil without
}

func (r *Registry[K]) acquire(ctx context.Context, keys []K, wait bool) (*slots.Slot, error) {
	if ctx == nil {
		return nil, slots.ErrNilContext
	}
	if len(keys) == 0 {
		return nil, registry.ErrNoKeys
	}
	// Before anything goes to Redis, and before dedupe compares them: the
	// local registry's rule, so that the key is refused whether or not
	// Redis is reachable.
	for _, k := range keys {
		if err := r.validKey(k); err != nil {
			r.stats.rejected.Add(1)
			return nil, err
		}
	}
	keys = dedupe(keys)
	l := &lease[K]{r: r, id: newLeaseID(), keys: keys, names: make([]string, len(keys))}
	l.cancel, _ = ctx.Value(cancelKey{}).(context.CancelCauseFunc)
	for i, k := range keys {
		l.names[i] = r.prefix + r.keyName(k)
	}
	s, err := r.admit(ctx, l, wait)
	if err != nil {
		r.stats.rejected.Add(1)
	}
	return s, err
}

// admit decides for l once, or with wait until it is admitted or fails for
// good.
func (r *Registry[K]) admit(ctx context.Context, l *lease[K], wait bool) (*slots.Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fleet: acquire: %w", err)
	}
	if !wait {
		o := r.attempt(ctx, l)
		return o.slot, o.err
	}
	w := &waiter{rank: core.Rank(core.PlaceOf(ctx).Class), keys: l.names, wake: make(chan struct{}, 1)}
	if err := r.enqueue(w); err != nil {
		return nil, err
	}
	defer r.dequeue(w)
	backoff := r.cfg.pollMin
	for {
		if !r.mayTry(w) {
			if err := r.sleep(ctx, w, r.cfg.pollMax); err != nil {
				return nil, err
			}
			continue
		}
		o := r.attempt(ctx, l)
		if o.full < 0 {
			return o.slot, o.err // admitted, or failed for good
		}
		r.blockedOn(w, l.names[o.full])
		// Wait for a wake-up, at most the backoff (jittered) and never past
		// the earliest expiry on the full key.
		sleep := jitter(backoff)
		if o.retryIn > 0 {
			sleep = min(sleep, o.retryIn)
		}
		backoff = min(2*backoff, r.cfg.pollMax)
		if err := r.sleep(ctx, w, sleep); err != nil {
			return nil, err
		}
	}
}

func (r *Registry[K]) sleep(ctx context.Context, w *waiter, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.wake:
	case <-t.C:
	case <-ctx.Done():
		return fmt.Errorf("fleet: acquire: %w", ctx.Err())
	case <-r.stopping.Done():
		return ErrClosed
	}
	return nil
}

// outcome is one admission decision.
type outcome struct {
	slot    *slots.Slot
	err     error
	full    int           // with ErrLimitReached: the index of the full key; else -1
	retryIn time.Duration // with full: until its earliest lease expires (0: unknown)
}

func failed(err error) outcome { return outcome{err: err, full: -1} }

// limitsLocked records in l the current limits of its keys.
func (r *Registry[K]) limitsLocked(l *lease[K]) {
	l.limits = l.limits[:0]
	for _, k := range l.keys {
		l.limits = append(l.limits, r.limitLocked(k))
	}
}

// maxCarried bounds the (key, lease) pairs of degraded leases that one
// admission carries into Redis (see carryLocked).
const maxCarried = batchSize

// acquireCall is an acquire script call: its keys and arguments (see
// acquireScript), its not-after time, and the degraded leases it carries.
type acquireCall[K comparable] struct {
	keys    []string
	args    []any
	until   int64
	carried []*lease[K]
}

// lateSpan is how long after it is made a call may still be running as a
// caller waits for it: the call timeout, twice for a call queued for a
// pipeline.
func (r *Registry[K]) lateSpan() time.Duration { return 2 * r.cfg.opTimeout }

// scriptArgs returns the acquire call for l, or ErrClosed.
func (r *Registry[K]) scriptArgs(l *lease[K]) (acquireCall[K], error) {
	r.mu.Lock()
	defer r.mu.Unlock() // a LimitFunc that panics must not leave it locked
	if r.closed {
		return acquireCall[K]{}, ErrClosed
	}
	r.limitsLocked(l)
	c := acquireCall[K]{
		keys:  make([]string, 0, 2+len(l.names)),
		args:  make([]any, 0, 4+len(l.names)),
		until: r.clock.notAfter(r.lateSpan()),
	}
	c.keys = append(c.keys, r.epochKey, r.tombstone(l.id))
	c.keys = append(c.keys, l.names...)
	c.args = append(c.args, l.id, r.cfg.ttl.Milliseconds(), len(l.names), scriptUntil(c.until))
	for _, n := range l.limits {
		c.args = append(c.args, n)
	}
	if len(r.degraded) > 0 {
		r.carryLocked(l, &c)
	}
	return c, nil
}

// carryLocked adds to c the leases this process admitted while Redis was
// unreachable and that share a key with l: c's script puts them into Redis
// before it decides, so that they count against l. Past maxCarried pairs
// the rest are left to the heartbeat, woken for them.
func (r *Registry[K]) carryLocked(l *lease[K], c *acquireCall[K]) {
	pairs := 0
	for d := range r.degraded {
		if !slices.ContainsFunc(d.names, func(n string) bool { return slices.Contains(l.names, n) }) {
			continue
		}
		if pairs+len(d.names) > maxCarried {
			r.recovered()
			return
		}
		d.sent = true // the call may run after d is released: abandon d then
		d.until = max(d.until, c.until)
		for _, name := range d.names {
			c.keys = append(c.keys, name, r.tombstone(d.id))
			c.args = append(c.args, d.id)
		}
		c.carried = append(c.carried, d)
		pairs += len(d.names)
	}
}

// carriedIn records that the carried leases are in Redis, under epoch. One
// released meanwhile was abandoned (it was marked sent): its tombstone kept
// it out, or its removal takes it out.
func (r *Registry[K]) carriedIn(carried []*lease[K], epoch int64) {
	if len(carried) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range carried {
		if _, live := r.leases[d]; live && d.degraded {
			r.inRedisLocked(d, epoch)
			r.stats.reasserted.Add(1)
		}
	}
}

// inRedisLocked records that l is in Redis under epoch.
func (r *Registry[K]) inRedisLocked(l *lease[K], epoch int64) {
	if l.degraded {
		l.degraded = false
		delete(r.degraded, l)
		r.degraded = remade(r.degraded, &r.degradedPeak)
	}
	l.epoch, l.reported = epoch, false
}

// attempt makes one admission decision for l: in Redis, or, when Redis
// cannot be reached (the breaker is open, or this call failed), as
// WithUnavailable says.
func (r *Registry[K]) attempt(ctx context.Context, l *lease[K]) outcome {
	var c acquireCall[K]
	var rp reply
	for try := 0; ; try++ {
		var err error
		c, err = r.scriptArgs(l)
		if err != nil {
			return failed(err)
		}
		if !r.brk.allow() {
			return r.unavailable(ctx, l)
		}
		rp = r.callOrAbandon(ctx, l, c)
		// Refused as late, with nothing done: the server's clock is ahead
		// of what earlier replies told (it jumped, or a client timeout
		// longer than the call timeout let the call run on). The reply
		// told it anew: once more.
		if rp.err != nil || len(rp.res) != 6 || rp.res[0] != tooLate || try > 0 {
			break
		}
	}
	res := rp.res
	if err := rp.err; err != nil {
		if rp.sent {
			// The call may still run on the server: take back what it
			// adds, and go on under a new lease id.
			r.abandon(l)
		}
		switch {
		case errors.Is(err, ErrClosed):
			return failed(ErrClosed)
		case ctx.Err() != nil: // the caller's context ended, not Redis
			return failed(fmt.Errorf("fleet: acquire: %w", ctx.Err()))
		}
		return r.unavailable(ctx, l) // a failure, or the breaker opened while it was queued
	}
	if len(res) != 6 || res[0] < 0 {
		r.abandon(l)
		return failed(fmt.Errorf("fleet: unexpected script reply %v", res))
	}
	epoch := res[5]
	r.carriedIn(c.carried, epoch)
	if res[0] == 0 {
		i := int(res[1]) - 1
		le := &slots.LimitError{Err: slots.ErrLimitReached, Key: r.keyName(l.keys[i]), InFlight: int(res[2]), Limit: l.limits[i], RetryAfter: time.Second}
		var retryIn time.Duration
		if res[3] > res[4] {
			retryIn = time.Duration(res[3]-res[4]) * time.Millisecond
			le.RetryAfter = max(time.Second, retryIn.Round(time.Second))
		}
		return outcome{err: le, full: i, retryIn: retryIn}
	}
	return r.hold(ctx, l, false, epoch)
}

// callOrAbandon makes l's acquire call. If the call panics (a client hook),
// whatever it may have added is taken back before the panic goes on: l is
// not held, so nothing else would renew or remove it.
func (r *Registry[K]) callOrAbandon(ctx context.Context, l *lease[K], c acquireCall[K]) reply {
	l.until = max(l.until, c.until) // l is not shared yet
	ok := false
	defer func() {
		if !ok {
			r.queueRelease(l.abandonment())
		}
	}()
	rp := r.call(ctx, c.keys, c.args, len(l.names), c.until)
	ok = true
	return rp
}

// tombstone is the key that marks lease id abandoned.
func (r *Registry[K]) tombstone(id string) string { return r.prefix + "abandoned:" + id }

// abandon queues the removal of whatever a failed call for l may have put
// into Redis, and gives l a new id for what comes next.
func (r *Registry[K]) abandon(l *lease[K]) {
	r.queueRelease(l.abandonment())
	l.id = newLeaseID()
}

// abandonment is a stand-in for l's current id, to be taken back with a
// tombstone.
func (l *lease[K]) abandonment() *lease[K] {
	return &lease[K]{r: l.r, id: l.id, names: l.names, limits: slices.Clone(l.limits), until: l.until, abandoned: true}
}

// hold finishes an admission: the local mirror slot, the lease record, and
// the Slot. With degraded, the lease is not in Redis (yet); else Redis
// admitted it under epoch. A caller whose context has ended by the time the
// lease is recorded is not admitted: the lease is given back.
func (r *Registry[K]) hold(ctx context.Context, l *lease[K], degraded bool, epoch int64) outcome {
	if ctx.Err() != nil {
		return r.giveBack(ctx, l, degraded, false)
	}
	var local *slots.Slot
	for try := 0; ; try++ {
		var err error
		local, err = r.localAcquire(l, degraded)
		if err == nil {
			break
		}
		if !degraded {
			// This process holds more than Redis counts (leases lost and
			// not put back, or local limits other than the fleet's):
			// admit anyway; Redis has counted this one.
			local = nil
			break
		}
		// The local cap is the cap now.
		var le *slots.LimitError
		if !errors.As(err, &le) {
			return failed(err)
		}
		if o, ok := r.localFull(l, le); ok || try == 2 {
			return o
		}
		// No key is full any more: a release came in between. Try again.
	}
	l.local = local
	v, h := core.NewSlot()
	h.Owner, l.hold = l, h
	h.At = time.Now().UnixNano()
	h.Degraded = degraded
	r.mu.Lock()
	if r.closed || ctx.Err() != nil {
		closed := r.closed
		r.mu.Unlock()
		return r.giveBack(ctx, l, degraded, closed)
	}
	l.degraded, l.epoch = degraded, epoch
	if degraded {
		r.degraded[l] = struct{}{}
		r.degradedPeak = max(r.degradedPeak, len(r.degraded))
	}
	r.leases[l] = struct{}{}
	r.leasesPeak = max(r.leasesPeak, len(r.leases))
	r.mu.Unlock()
	if degraded {
		r.stats.degraded.Add(1)
	} else {
		r.stats.acquired.Add(1)
	}
	return outcome{slot: v.(*slots.Slot), full: -1}
}

// giveBack undoes an admission of l that is not to be: its local mirror,
// and, if Redis admitted it, its lease (with a wake-up, as a release). It
// returns ErrClosed, or the error of ctx, which has ended.
func (r *Registry[K]) giveBack(ctx context.Context, l *lease[K], degraded, closed bool) outcome {
	func() {
		// Deferred, so that the lease leaves Redis even if the local
		// release panics (an Observer), as in Release.
		switch {
		case degraded:
		case closed:
			defer r.remove(context.Background(), []*lease[K]{l.abandonment()}) // the releaser may have stopped
		default:
			defer r.queueRelease(l)
		}
		l.releaseLocal()
	}()
	if closed {
		return failed(ErrClosed)
	}
	return failed(fmt.Errorf("fleet: acquire: %w", ctx.Err()))
}

// localAcquire takes l's mirror in the local registry. If that panics (an
// Observer, a local LimitFunc), a lease Redis admitted is taken back, as in
// Release: it is not held, so nothing would renew or remove it.
func (r *Registry[K]) localAcquire(l *lease[K], degraded bool) (*slots.Slot, error) {
	ok := false
	defer func() {
		if !ok && !degraded {
			r.queueRelease(l.abandonment())
		}
	}()
	s, err := r.local.TryAcquireAll(l.keys...)
	ok = true
	return s, err
}

// localFull tells the local registry's refusal le of l again, naming the
// first of l's keys that is full there by its name in Redis, as a refusal
// by Redis names it. It reports false if none is full any more.
func (r *Registry[K]) localFull(l *lease[K], le *slots.LimitError) (outcome, bool) {
	for i, k := range l.keys {
		n, limit := r.local.InFlight(k), r.local.Limit(k)
		if n >= limit {
			err := &slots.LimitError{Err: le.Err, Key: r.keyName(k), InFlight: n, Limit: limit, RetryAfter: le.RetryAfter}
			return outcome{err: err, full: i}, true
		}
	}
	return outcome{err: le, full: 0}, false
}

// unavailable admits l, or not, while Redis cannot be reached.
func (r *Registry[K]) unavailable(ctx context.Context, l *lease[K]) outcome {
	switch r.cfg.onUnavailable {
	case FailClosed:
		return failed(ErrUnavailable)
	case FailOpen:
		if err := ctx.Err(); err != nil {
			return failed(fmt.Errorf("fleet: acquire: %w", err))
		}
		v, h := core.NewSlot()
		h.Owner, l.hold = l, h
		h.At = time.Now().UnixNano()
		h.Bypassed, h.Degraded = true, true
		r.stats.bypassed.Add(1)
		return outcome{slot: v.(*slots.Slot), full: -1}
	}
	return r.hold(ctx, l, true, 0)
}

func (r *Registry[K]) redisFailed(err error) {
	if r.stopping.Err() != nil {
		return // Close cancelled it: not Redis's failure
	}
	r.stats.redisErrors.Add(1)
	if r.brk.failure() {
		r.logSafely(slog.LevelWarn, "fleet: redis unavailable; breaker open", slog.String("registry", r.prefix), slog.Any("error", err))
	}
}

// Release implements core.Owner: it frees the local mirror at once and
// queues the removal from Redis. It never waits for Redis.
func (l *lease[K]) Release(h *core.Hold) bool {
	if h != l.hold {
		l.Misuse(h) // a copied Slot: it holds nothing
		return false
	}
	if h.Bypassed {
		return true
	}
	out, limitPanic := l.releasing()
	func() {
		if out != nil { // even if the local release panics (an Observer)
			defer l.r.queueRelease(out)
		}
		l.releaseLocal()
	}()
	if limitPanic != nil {
		panic(limitPanic) // the LimitFunc's, once the lease is on its way out
	}
	return true
}

// minRemade is the peak below which a shrunk map (or queue) is kept as it
// is: remaking a small one gains little.
const minRemade = 1024

// remade returns m, or, if it has shrunk to a quarter of its peak (of
// minRemade entries or more), a copy of it made anew, with the peak
// reset. A Go map keeps its buckets when entries are deleted: so memory
// follows what is live after a burst.
func remade[M ~map[K]V, K comparable, V any](m M, peak *int) M {
	n := len(m)
	if *peak < minRemade || n*4 > *peak {
		return m
	}
	fresh := make(M, n)
	maps.Copy(fresh, m)
	*peak = n
	return fresh
}

// releasing drops l from the held leases and returns what to remove from
// Redis (nil: nothing), and what the LimitFunc panicked with, if it did.
func (l *lease[K]) releasing() (out *lease[K], limitPanic any) {
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.leases, l)
	r.leases = remade(r.leases, &r.leasesPeak)
	if l.degraded {
		delete(r.degraded, l)
		r.degraded = remade(r.degraded, &r.degradedPeak)
	}
	// A degraded lease is not in Redis: nothing to remove. After Close
	// nothing is sent: the lease expires after the TTL.
	if (l.degraded && !l.sent) || r.closed {
		return nil, nil
	}
	// The wake-up is for a key full by its limit now or, if the LimitFunc
	// panics, by its limit at the admission.
	old := slices.Clone(l.limits)
	func() {
		done := false
		defer func() {
			if !done {
				limitPanic = recover()
				l.limits = old
			}
		}()
		r.limitsLocked(l)
		done = true
	}()
	if l.sent {
		return l.abandonment(), limitPanic // a renewal may still put it back
	}
	return l, limitPanic
}

func (l *lease[K]) releaseLocal() {
	if l.local != nil {
		l.local.Release()
	}
}

// Misuse implements core.Owner.
func (l *lease[K]) Misuse(*core.Hold) { l.r.stats.doubleReleases.Add(1) }

// Time implements core.Owner.
func (l *lease[K]) Time(at int64) time.Time { return time.Unix(0, at) }

func newLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

func dedupe[K comparable](keys []K) []K {
	uniq := make([]K, 0, len(keys))
	for _, k := range keys {
		if !slices.Contains(uniq, k) {
			uniq = append(uniq, k)
		}
	}
	return uniq
}
