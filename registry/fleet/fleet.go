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
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry"
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
