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
// process: SetLimit takes effect at the next admission.
//
// A lease never expires under a live holder: one heartbeat goroutine per
// Registry renews every held lease each LeaseTTL/3, in batched calls.
// Renewal extends only leases that still exist. A lease found missing (Redis
// restarted, or failed over without it) is put back without a cap check, or
// with WithLostLeases(ReportLost) only reported. A process that dies
// holding leases frees them when they expire, after at most LeaseTTL.
//
// Release removes the lease from every key and publishes a wake-up, off the
// request path (a background goroutine, with its own timeout); a second
// Release does nothing.
//
// # Waiting
//
// Acquire polls with jittered backoff, never sleeping past the earliest
// lease expiry the script reported or the context's deadline, and wakes early
// on a release anywhere in the fleet (Redis pub/sub; a hint only, the polling
// stays). Within one process, waiters are served in arrival order per key: a
// waiter blocked on a full key goes before later waiters on that key, and
// holds back no waiter on other keys.
//
// # When Redis is unreachable
//
// A breaker opens after consecutive failures (WithBreaker), so that while
// Redis is down an admission costs no round trip; a background probe closes
// it again. Meanwhile each Registry does what WithUnavailable says:
// FallbackLocal (the default) admits under this process's local registry
// alone, with the same limits, and the Slot reports Degraded; its lease is
// put into Redis, without a cap check, once Redis is back. FailClosed fails
// with ErrUnavailable. FailOpen admits a Bypassed, Degraded Slot that holds
// nothing.
//
// Give the client short timeouts so that a dead Redis fails fast:
//
//	redis.NewClient(&redis.Options{
//		Addr:                  "127.0.0.1:6379",
//		DialTimeout:           250 * time.Millisecond,
//		ReadTimeout:           250 * time.Millisecond,
//		WriteTimeout:          250 * time.Millisecond,
//		ContextTimeoutEnabled: true, // honour each call's context deadline
//		MaxRetries:            1,
//	})
//
// Every key of a Registry shares one Redis Cluster hash tag, its name, so
// any AcquireAll runs as one script on Redis Cluster; all of a Registry's
// keys live on one node of the cluster.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
)

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

	mu       sync.Mutex // protects the fields below
	limits   map[K]int  // SetLimit overrides
	leases   map[*lease[K]]struct{}
	waiters  []*waiter
	closed   bool
	released chan *lease[K] // to the releaser

	// redisMu orders the heartbeat's renewals and the releaser's removals:
	// a lease released while a renewal of it is under way is removed after
	// that renewal, so a renewal cannot put back a released lease.
	redisMu sync.Mutex

	brk        breaker
	stats      counters
	subscribed chan struct{} // closed once Redis confirms the wake-up subscription
	stop       context.CancelFunc
	done       sync.WaitGroup
	stopping   context.Context
}

type counters struct {
	acquired, rejected, degraded, bypassed atomic.Uint64
	lost, reasserted, redisErrors          atomic.Uint64
	doubleReleases                         atomic.Uint64
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
	if name == "" {
		panic("fleet: empty registry name")
	}
	cfg := defaults()
	for _, o := range opts {
		o(&cfg)
	}
	r := &Registry[K]{
		rdb:      rdb,
		cfg:      cfg,
		keyName:  func(k K) string { return fmt.Sprint(k) },
		prefix:   cfg.prefix + "{" + name + "}:",
		defLimit: defaultLimit,
		limits:   map[K]int{},
		leases:   map[*lease[K]]struct{}{},
		released: make(chan *lease[K], releaseQueue),

		subscribed: make(chan struct{}),
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
	r.channel = r.prefix + "released"
	r.local = registry.New[K](defaultLimit, cfg.local...)
	r.brk.threshold = cfg.breakAfter
	r.stopping, r.stop = context.WithCancel(context.Background())
	r.done.Add(3)
	go r.heartbeat()
	go r.releaser()
	go r.subscribe()
	return r
}

// Local returns the in-process registry that mirrors this process's holders
// (and caps alone while Redis is unavailable, with FallbackLocal): watch it
// with sweep and inflightprom. Acquire through the fleet Registry, not
// through it.
func (r *Registry[K]) Local() *registry.Registry[K] { return r.local }

// Close stops the heartbeat, the releaser and the subscription, after
// removing from Redis the leases released so far. Leases still held expire
// after LeaseTTL. Acquire fails with ErrClosed afterwards.
func (r *Registry[K]) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	waiters := slices.Clone(r.waiters)
	r.mu.Unlock()
	for _, w := range waiters {
		w.signal()
	}
	r.stop()
	r.done.Wait()
}

// SetLimit sets key's fleet-wide limit (and its local one). Every process
// must set the same limits; each admission sends its process's limits.
func (r *Registry[K]) SetLimit(key K, n int) {
	if n < 0 {
		r.cfg.log().Warn("fleet: SetLimit with a negative limit ignored", slog.Int("limit", n))
		return
	}
	r.mu.Lock()
	r.limits[key] = n
	r.mu.Unlock()
	r.local.SetLimit(key, n)
	r.wakeAll()
}

// ClearLimit returns key to the default limit.
func (r *Registry[K]) ClearLimit(key K) {
	r.mu.Lock()
	delete(r.limits, key)
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
	Lost           uint64 // leases found missing in Redis by the heartbeat
	Reasserted     uint64 // leases put back into Redis (lost, or degraded and Redis back)
	RedisErrors    uint64 // failed calls to Redis
	DoubleReleases uint64
	BreakerOpen    bool // Redis is considered unavailable now
}

// Stats returns the counts.
func (r *Registry[K]) Stats() Stats {
	r.mu.Lock()
	st := Stats{Held: len(r.leases), Waiting: len(r.waiters)}
	r.mu.Unlock()
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
// (expired leases excluded), or an error if Redis cannot be asked.
func (r *Registry[K]) InFlight(ctx context.Context, key K) (int, error) {
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
// or ErrUnavailable (FailClosed, Redis unreachable).
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
// registry.ErrNoKeys.
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
	degraded bool        // not in Redis yet: admitted while Redis was unavailable (guarded by r.mu)
}

func (r *Registry[K]) acquire(ctx context.Context, keys []K, wait bool) (*slots.Slot, error) {
	if ctx == nil {
		return nil, slots.ErrNilContext
	}
	if len(keys) == 0 {
		return nil, registry.ErrNoKeys
	}
	keys = dedupe(keys)
	if err := ctx.Err(); err != nil {
		r.stats.rejected.Add(1)
		return nil, fmt.Errorf("fleet: acquire: %w", err)
	}
	l := &lease[K]{r: r, id: newLeaseID(), keys: keys, names: make([]string, len(keys))}
	for i, k := range keys {
		l.names[i] = r.prefix + r.keyName(k)
	}
	if !wait {
		return r.attempt(ctx, l)
	}
	w := &waiter{keys: l.names, wake: make(chan struct{}, 1)}
	if err := r.enqueue(w); err != nil {
		return nil, err
	}
	defer r.dequeue(w)
	backoff := r.cfg.pollMin
	for {
		if r.mayTry(w) {
			s, err := r.attempt(ctx, l)
			var le *slots.LimitError
			if !errors.As(err, &le) || !errors.Is(err, slots.ErrLimitReached) {
				return s, err // admitted, or failed for good
			}
			r.blockedOn(w, r.prefix+le.Key)
			// Wait for a wake-up, at most the backoff (jittered) and never
			// past the earliest expiry on the full key.
			sleep := jitter(backoff)
			var re *retryError
			if errors.As(err, &re) && re.retryInMS > 0 {
				sleep = min(sleep, time.Duration(re.retryInMS)*time.Millisecond)
			}
			backoff = min(2*backoff, r.cfg.pollMax)
			if err := r.sleep(ctx, w, sleep); err != nil {
				return nil, err
			}
			continue
		}
		if err := r.sleep(ctx, w, r.cfg.pollMax); err != nil {
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
		r.stats.rejected.Add(1)
		return fmt.Errorf("fleet: acquire: %w", ctx.Err())
	case <-r.stopping.Done():
		r.stats.rejected.Add(1)
		return ErrClosed
	}
	return nil
}

// attempt makes one admission decision for l: in Redis, or while the
// breaker is open, as WithUnavailable says.
func (r *Registry[K]) attempt(ctx context.Context, l *lease[K]) (*slots.Slot, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	args := make([]any, 2, 2+len(l.keys))
	args[0], args[1] = l.id, r.cfg.ttl.Milliseconds()
	l.limits = l.limits[:0]
	for _, k := range l.keys {
		n := r.limitLocked(k)
		l.limits = append(l.limits, n)
		args = append(args, n)
	}
	r.mu.Unlock()

	if !r.brk.allow() {
		return r.unavailable(l)
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.opTimeout)
	res, err := acquireScript.Run(cctx, r.rdb, l.names, args...).Int64Slice()
	cancel()
	if err != nil {
		if ctx.Err() != nil { // the caller's context, not Redis
			r.stats.rejected.Add(1)
			return nil, fmt.Errorf("fleet: acquire: %w", ctx.Err())
		}
		r.redisFailed(err)
		return r.unavailable(l)
	}
	r.brk.success()
	if len(res) != 5 {
		return nil, fmt.Errorf("fleet: unexpected script reply %v", res)
	}
	if res[0] != 1 {
		i := int(res[1]) - 1
		r.stats.rejected.Add(1)
		le := &slots.LimitError{Err: slots.ErrLimitReached, Key: r.keyName(l.keys[i]), InFlight: int(res[2]), Limit: args[2+i].(int)}
		le.RetryAfter = time.Second
		if res[3] > res[4] {
			le.RetryAfter = max(time.Second, time.Duration(res[3]-res[4])*time.Millisecond)
		}
		return nil, &retryError{LimitError: le, retryInMS: max(res[3]-res[4], 0)}
	}
	return r.hold(l, false)
}

// retryError is a fleet rejection that knows when the earliest lease on the
// full key expires.
type retryError struct {
	*slots.LimitError
	retryInMS int64
}

func (e *retryError) Unwrap() error { return e.LimitError }

// hold finishes an admission: the local mirror slot, the lease record, and
// the Slot. With degraded, the lease is not in Redis (yet).
func (r *Registry[K]) hold(l *lease[K], degraded bool) (*slots.Slot, error) {
	local, err := r.local.TryAcquireAll(l.keys...)
	if err != nil {
		if degraded {
			r.stats.rejected.Add(1)
			return nil, err // the local cap is the cap now
		}
		// This process holds more than Redis counts (degraded holders not
		// yet put back): admit anyway; Redis has counted this one.
		local = nil
	}
	l.local = local
	v, h := core.NewSlot()
	h.Owner = l
	h.At = time.Now().UnixNano()
	h.Degraded = degraded
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		l.releaseLocal()
		r.queueRelease(l)
		return nil, ErrClosed
	}
	l.degraded = degraded
	r.leases[l] = struct{}{}
	r.mu.Unlock()
	if degraded {
		r.stats.degraded.Add(1)
	} else {
		r.stats.acquired.Add(1)
	}
	return v.(*slots.Slot), nil
}

// unavailable admits l, or not, while Redis cannot be reached.
func (r *Registry[K]) unavailable(l *lease[K]) (*slots.Slot, error) {
	switch r.cfg.onUnavailable {
	case FailClosed:
		r.stats.rejected.Add(1)
		return nil, ErrUnavailable
	case FailOpen:
		v, h := core.NewSlot()
		h.Owner = l
		h.At = time.Now().UnixNano()
		h.Bypassed, h.Degraded = true, true
		r.stats.bypassed.Add(1)
		return v.(*slots.Slot), nil
	}
	return r.hold(l, true)
}

func (r *Registry[K]) redisFailed(err error) {
	r.stats.redisErrors.Add(1)
	if r.brk.failure() {
		r.cfg.log().Warn("fleet: redis unavailable; breaker open", slog.String("registry", r.prefix), slog.Any("error", err))
	}
}

// Release implements core.Owner: it frees the local mirror at once and
// queues the removal from Redis.
func (l *lease[K]) Release(h *core.Hold) {
	if h.Bypassed {
		return
	}
	r := l.r
	r.mu.Lock()
	delete(r.leases, l)
	degraded := l.degraded
	r.mu.Unlock()
	l.releaseLocal()
	if !degraded {
		r.queueRelease(l)
	}
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
