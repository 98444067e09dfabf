// Package registry caps how many holders each key may have at once: per
// tenant, per model, per API key, or several of these together.
//
// A Registry counts live holders, never a counter: a key's in-flight count is
// the number of Slots admitted under it and not yet released. There is no TTL
// and no eviction: a key with a live holder or waiter is never removed, and a
// key is removed by the release (or withdrawal) that leaves it with neither,
// so memory follows what is live. Rejections insert nothing.
//
//	reg := registry.New[string](64) // default limit per key
//	reg.SetLimit("org-a", 4)
//	s, err := reg.TryAcquire("org-a")
//	if err != nil {
//		return err // *slots.LimitError with Key, InFlight, Limit, RetryAfter
//	}
//	defer s.Release()
//
// AcquireAll admits under several keys at once (a provider cap and a model
// cap, say): the returned Slot holds every key's capacity or the call fails
// holding none. A waiting AcquireAll holds nothing while it waits, never
// delays callers of keys it does not need, and cannot deadlock whatever the
// order of keys. It is passed over at most MaxPassed times: after that many
// admissions on its keys have gone to callers that came after it, each of
// its keys keeps a slot for it (see AcquireAll).
//
// Waiters on one key are served in arrival order among those that can be
// served: a waiter that also needs a full key does not hold back one behind it
// whose keys are all free. TryAcquire never passes a waiter that could be
// served.
//
// Keys are spread over lock shards by hash, so unrelated keys rarely contend.
package registry

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"math/bits"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/inflight-go/inflight/internal/clockx"
	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/ilist"
	"github.com/inflight-go/inflight/internal/policy"
	"github.com/inflight-go/inflight/slots"
)

var (
	// ErrInvalidKey: the key is over the WithMaxKeyBytes bound.
	ErrInvalidKey = errors.New("registry: invalid key")
	// ErrNoKeys: AcquireAll or TryAcquireAll was given no key.
	ErrNoKeys = errors.New("registry: no keys")
)

const saturationLogEvery = 10 * time.Second

// Registry caps holders per key. Create it with New; the zero value is not
// usable.
type Registry[K comparable] struct {
	cfg          config
	defaultLimit int
	clk          *clockx.Clock
	seed         maphash.Seed
	shards       []shard[K]
	shardBits    uint
	keyLen       func(K) int // nil: keys are not length-checked
	selfCheck    bool        // K may hold a NaN or an uncomparable dynamic value
	limitFunc    LimitFunc[K]
	obs          slots.Observer // nil: no events
	shares       *core.Shares   // nil: classes have no guaranteed share

	// multiMu serialises everything that involves a waiter needing several
	// keys: AcquireAll, the release or limit change of a key such waiters
	// queue on, and their withdrawal. It is taken before any shard lock;
	// shard locks are taken in ascending index order.
	multiMu sync.Mutex

	// Written now and then (every 16th release samples the hold time); kept
	// off the cache line of the read-mostly fields above, which every
	// admission on every core reads.
	_              [64]byte
	waitSeq        atomic.Uint64 // arrival order of waiters
	invalidKeys    atomic.Uint64
	sweepAt        atomic.Int64 // when the next acquire prunes idle shards' caches (pruneIdleShards)
	doubleReleases atomic.Uint64
	leaks          atomic.Uint64
	hold           policy.HoldTime
	satLog         policy.Every
	limitLog       policy.Every
}

type shard[K comparable] struct {
	// What an admission and a release write, in one cache line: the cores
	// hand each shard's lines back and forth, so every line counts.
	mu       sync.Mutex // protects the shard and the lanes of its entries
	lanes    table[K]
	seq      uint64    // holder ids handed out: admissions and bypasses
	released uint64    // holds given back
	spare    *entry[K] // an idle entry kept for reuse, tried before free

	r         *Registry[K]
	idx       int
	free      []*entry[K] // more idle entries kept for reuse
	overrides map[K]int   // SetLimit
	resolved  map[K]resolved
	// The cache of fetched limits is pruned when it reaches pruneAt
	// entries or a refresh interval after prunedAt (clock nanos), and made
	// anew when it has shrunk well below resolvedPeak (pruneResolvedLocked).
	pruneAt      int
	prunedAt     int64
	resolvedPeak int
	st           counters
	_            [64]byte // keep neighbouring shards off this cache line
}

// counters are a shard's rarer outcomes; admissions are seq - bypassed.
type counters struct {
	waited, bypassed                      uint64
	limitReached, queueFull, waitTimeouts uint64
	canceled                              uint64
}

type resolved struct {
	n     int
	at    int64         // clock nanos of the last successful fetch
	ok    bool          // n came from a successful fetch
	fetch chan struct{} // non-nil while a fetch runs; closed when it ends
	gen   uint64        // counts successful fetches, so a late one yields
}

// entry is one live key: its lane of capacity. It is the Owner of the holds
// admitted under that key alone.
type entry[K comparable] struct {
	// In the order an admission reads and writes them: for string keys,
	// everything up to the lane's holders fits one cache line.
	shard *shard[K]
	hash  uint64
	key   K
	lane  core.Lane
	// multis links the multi-key waiters queued on the key (lane.Multi of
	// them), so that finding them does not walk the whole queue.
	multis ilist.List[*core.Waiter]
}

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

// outranks reports whether a multi-key waiter w, on a lane where class c
// is short of its share (WithShare) or not, goes before a later caller of
// class c: if it is of c's class, or of a higher one and the slot is not
// one that c's share owes c.
func outranks(w *core.Waiter, c uint8, short bool) bool {
	return core.Rank(w.Class) == core.Rank(c) || core.Rank(w.Class) < core.Rank(c) && !short
}

// blockedLocked reports whether a caller of class c that arrived at seq
// must leave a free slot of e to older multi-key waiters: each one that
// outranks it and has been passed over MaxPassed times keeps one slot of e,
// so the caller may take one only if more are free. Call with multiMu and
// e's shard held.
func blockedLocked[K comparable](e *entry[K], c uint8, seq uint64) bool {
	if e.lane.Multi == 0 {
		return false
	}
	short, kept := e.lane.Short(c), 0
	for el := e.multis.Front(); el != nil; el = el.Next() {
		w := el.Value
		if w.Seq < seq && outranks(w, c, short) && w.Hold.Owner.(*multi[K]).urgent() {
			kept++
		}
	}
	return kept > 0 && e.lane.Limit-e.lane.Holders.Len() <= kept
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
			w.Hold.Owner.(*multi[K]).passed++
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
func admitsLocked[K comparable](e *entry[K], c uint8) bool {
	if e.lane.Multi == 0 {
		return e.lane.Admits(c)
	}
	return e.lane.CanTake(c) && !blockedLocked(e, c, newcomer)
}

const maxFreeEntries = 32

// New returns a Registry in which every key may have defaultLimit holders
// at once unless SetLimit or WithLimitFunc says otherwise. slots.Unlimited is
// a default that never binds. It panics if defaultLimit is negative.
func New[K comparable](defaultLimit int, opts ...Option) *Registry[K] {
	if defaultLimit < 0 {
		panic(fmt.Sprintf("registry: negative default limit %d", defaultLimit))
	}
	cfg := config{shards: DefaultShards, maxKeyBytes: DefaultMaxKeyBytes}
	for _, o := range opts {
		o.apply(&cfg)
	}
	n := 1 << bits.Len(uint(min(cfg.shards, MaxShards)-1))
	r := &Registry[K]{
		cfg:          cfg,
		defaultLimit: defaultLimit,
		clk:          clockx.New(cfg.wait.Clock),
		seed:         maphash.MakeSeed(),
		shards:       make([]shard[K], n),
		shardBits:    uint(bits.Len(uint(n - 1))),
	}
	for i := range r.shards {
		r.shards[i].idx = i
		r.shards[i].lanes.shift = uint32(r.shardBits)
		r.shards[i].r = r
	}
	if cfg.limitFunc != nil {
		fn, ok := cfg.limitFunc.(LimitFunc[K])
		if !ok {
			panic(fmt.Sprintf("registry: WithLimitFunc got %T, want registry.LimitFunc[%v]", cfg.limitFunc, reflect.TypeFor[K]()))
		}
		if cfg.refresh <= 0 {
			panic(fmt.Sprintf("registry: WithLimitFunc needs a positive refresh interval, got %v", cfg.refresh))
		}
		r.limitFunc = fn
	}
	if cfg.maxKeyBytes > 0 && reflect.TypeFor[K]().Kind() == reflect.String {
		// K's underlying type is string, so it has a string's layout.
		r.keyLen = func(k K) int { return len(*(*string)(unsafe.Pointer(&k))) }
	}
	r.selfCheck = mayBeUnequal(reflect.TypeFor[K]())
	r.obs, _ = cfg.wait.Observer.(slots.Observer)
	r.shares = cfg.wait.Shares
	return r
}

// mayBeUnequal reports whether values of t can be unequal to themselves (a
// NaN) or panic when compared (an interface holding a slice).
func mayBeUnequal(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128, reflect.Interface:
		return true
	case reflect.Array:
		return mayBeUnequal(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if mayBeUnequal(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

// equalsItself is false for a key that no map lookup could find again (it
// holds a NaN) or that cannot be hashed (it holds an uncomparable value).
func equalsItself[K comparable](k K) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return k == k
}

// shardFor returns key's shard and hash; the hash also indexes the shard's
// table, so a key is hashed once per operation.
func (r *Registry[K]) shardFor(key K) (*shard[K], uint64) {
	h := maphash.Comparable(r.seed, key)
	return &r.shards[h&uint64(len(r.shards)-1)], h
}

// lookup returns key's live entry in sh, or nil.
func (sh *shard[K]) lookup(key K, h uint64) *entry[K] { return sh.lanes.get(key, h) }

// checkKey is validKey for an admission: a bad key is a counted rejection.
func (r *Registry[K]) checkKey(key K) error {
	err := r.validKey(key)
	if err != nil {
		r.invalidKeys.Add(1)
		r.emit(slots.Event{Kind: slots.EventRejected, Err: ErrInvalidKey})
	}
	return err
}

// validKey rejects keys over the length bound, and keys that a map could
// never find again: a NaN (or a struct or interface holding one) is unequal to
// itself, and an interface holding a slice cannot be hashed at all.
func (r *Registry[K]) validKey(key K) error {
	if r.keyLen != nil {
		if n := r.keyLen(key); n > r.cfg.maxKeyBytes {
			return fmt.Errorf("%w: %d bytes, over the %d-byte bound", ErrInvalidKey, n, r.cfg.maxKeyBytes)
		}
	}
	if r.selfCheck && !equalsItself(key) {
		return fmt.Errorf("%w: the key is not equal to itself (NaN) or not comparable", ErrInvalidKey)
	}
	return nil
}

// CheckKey returns an error wrapping ErrInvalidKey if admissions would
// refuse key: over the WithMaxKeyBytes bound, or unequal to itself (it
// holds a NaN) or not comparable; nil otherwise. Admissions check it
// themselves; it is for a layer that must refuse a key before it passes the
// key on (as package registry/fleet does before it goes to Redis).
func (r *Registry[K]) CheckKey(key K) error { return r.validKey(key) }

// limitLocked returns the limit a key without a lane would start with.
func (r *Registry[K]) limitLocked(sh *shard[K], key K) int {
	if n, ok := sh.overrides[key]; ok {
		return n
	}
	if rv, ok := sh.resolved[key]; ok && rv.ok {
		return rv.n
	}
	return r.defaultLimit
}

// TryAcquire admits a Slot under key if the key has room, without waiting.
// Otherwise it returns a *slots.LimitError wrapping slots.ErrLimitReached
// and inserts nothing. Keys over the WithMaxKeyBytes bound fail with
// ErrInvalidKey.
func (r *Registry[K]) TryAcquire(key K) (*slots.Slot, error) {
	return r.acquireOne(nil, key)
}

// Acquire admits a Slot under key, waiting in arrival order while the key is
// full. It fails like slots.Limiter.Acquire: *slots.LimitError (queue full,
// wait timeout), an error wrapping ctx.Err(), or slots.ErrNilContext; with
// WithFailOpen a wait that reaches the maximum returns a Bypassed slot.
// A key whose limit is 0 waits until SetLimit raises it.
func (r *Registry[K]) Acquire(ctx context.Context, key K) (*slots.Slot, error) {
	if ctx == nil {
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrNilContext})
		return nil, slots.ErrNilContext
	}
	return r.acquireOne(ctx, key)
}

// endedLocked reports whether ctx (nil: a call that does not wait) has
// ended. Admissions ask it under their locks, as the last check before they
// decide: asked before, a context that ends and a slot that frees in between
// would admit a caller that has given up.
func endedLocked(ctx context.Context) bool { return ctx != nil && core.Ended(ctx) }

// canceled reports a caller whose context ended before it was admitted.
func (r *Registry[K]) canceled(ctx context.Context) error {
	r.emit(slots.Event{Kind: slots.EventRejected, Err: ctx.Err()})
	return fmt.Errorf("registry: acquire: %w", ctx.Err())
}

// pending is a Slot on its way to the caller. Without leak detection the
// hold admitted is the Slot's own; with it, a tracked hold apart from the
// Slot (see core.Tracked), for which the Slot becomes a stand-in.
type pending struct {
	s       *slots.Slot
	standIn *core.Hold // the hold inside s
	t       *core.Tracked
}

// newHold returns a pending Slot and the hold to admit for it.
func (r *Registry[K]) newHold() (pending, *core.Hold) {
	v, own := core.NewSlot()
	p := pending{s: v.(*slots.Slot), standIn: own}
	if !r.cfg.wait.LeakCheck {
		return p, own
	}
	p.t = new(core.Tracked)
	if r.cfg.wait.LeakSites {
		p.t.RecordSite(3) // above newHold, acquireOne or acquireAll, and the exported method
	}
	return p, &p.t.Hold
}

// handOut finishes an admission and returns the Slot.
func (p pending) handOut() *slots.Slot {
	if p.t != nil {
		core.AttachTo(p.t, p.s, p.standIn)
	}
	return p.s
}

// acquireOne admits under one key; ctx == nil means do not wait.
func (r *Registry[K]) acquireOne(ctx context.Context, key K) (*slots.Slot, error) {
	if err := r.checkKey(key); err != nil {
		return nil, err
	}
	sh, hash := r.shardFor(key)
	if r.limitFunc != nil {
		if err := r.refreshLimit(ctx, sh, key); err != nil {
			return nil, err
		}
	}
	p, h := r.newHold()
	h.At = r.clk.Coarse()
	// The caller's place matters to an admission only with shares; without
	// them it is read once the caller has to wait.
	var place core.Place
	if ctx != nil && r.shares != nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}

	sh.mu.Lock()
	var wk core.Wakes
	// set is nil while sh.mu alone is held; beside multi-key waiters it is
	// the shards held, with multiMu (lockBeside).
	var set []int
	e := sh.lookup(key, hash)
	if e != nil && e.lane.Multi > 0 {
		sh.mu.Unlock()
		e, set = r.lockBeside(sh, key, hash, &wk)
		if ctx != nil && r.shares == nil {
			place = core.PlaceOf(ctx) // the class matters beside them
			h.Class = place.Class
		}
	}
	if endedLocked(ctx) {
		r.unlockOne(sh, set, &wk)
		return nil, r.canceled(ctx)
	}
	limit := 0
	var room bool
	if e != nil {
		// Waiters that also need other keys may be queued while this key
		// has room; only a waiter for this key alone would be passed, or
		// the slot kept for one of them (admitsLocked).
		room = admitsLocked(e, h.Class)
	} else {
		limit = r.limitLocked(sh, key)
		room = r.freshAdmits(limit, h.Class)
	}
	if room {
		if e == nil {
			e = sh.addLocked(r, key, hash, limit)
		}
		h.Owner = e
		if set != nil {
			passLocked(e, h.Class, newcomer, nil)
		}
		sh.holdLocked(r, e, h, &h.Idx)
		r.unlockOne(sh, set, &wk)
		return r.acquired(p, 0), nil
	}
	if ctx == nil {
		sh.st.limitReached++
		err := r.rejectLocked(slots.ErrLimitReached, key, e, limit)
		r.unlockOne(sh, set, &wk)
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrLimitReached})
		return nil, err
	}
	if r.shares == nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	if r.queueFullLocked(e, place.Flow) {
		sh.st.queueFull++
		err := r.rejectLocked(slots.ErrQueueFull, key, e, limit)
		r.unlockOne(sh, set, &wk)
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrQueueFull})
		return nil, err
	}
	if e == nil {
		e = sh.addLocked(r, key, hash, limit)
	}
	return r.waitOne(ctx, p, h, e, key, place, set, &wk)
}

// lockBeside takes the locks to decide an admission under key, on which
// multi-key waiters queue: multiMu and, while such waiters are still there,
// their shards; and it serves what they can take now, so that a newcomer
// neither passes one that could be served nor takes a slot kept for one
// (admitsLocked). It returns key's entry (nil if it went meanwhile) and the
// shards it locked.
func (r *Registry[K]) lockBeside(sh *shard[K], key K, hash uint64, wk *core.Wakes) (*entry[K], []int) {
	r.multiMu.Lock()
	sh.mu.Lock()
	e := sh.lookup(key, hash)
	if e == nil || e.lane.Multi == 0 {
		return e, []int{sh.idx}
	}
	// Its multi-key waiters leave only under multiMu, so e stays live.
	sh.mu.Unlock()
	set, serve := r.lockForGrant([]*entry[K]{e}, nil)
	r.grantLocked(serve, wk)
	return e, set
}

// unlockOne releases what acquireOne holds (see set there) and wakes the
// waiters granted meanwhile.
func (r *Registry[K]) unlockOne(sh *shard[K], set []int, wk *core.Wakes) {
	if set == nil {
		sh.mu.Unlock()
	} else {
		r.unlockShards(set)
		r.multiMu.Unlock()
	}
	wk.Wake()
}

// acquired hands out an admitted Slot and reports it. If the Observer
// panics the Slot is released, since it never reaches its caller.
func (r *Registry[K]) acquired(p pending, wait time.Duration) *slots.Slot {
	s := p.handOut()
	if r.obs != nil {
		ok := false
		defer func() {
			if !ok {
				s.Release()
			}
		}()
		r.obs.Observe(slots.Event{Kind: slots.EventAcquired, Wait: wait})
		ok = true
	}
	return s
}

// freshAdmits reports whether a key that is not live, with limit, admits a
// newcomer of class c.
func (r *Registry[K]) freshAdmits(limit int, c uint8) bool {
	if r.shares == nil || limit <= 0 {
		return limit > 0
	}
	ln := core.Lane{Limit: limit, Shares: r.shares}
	return ln.CanTake(c)
}

// queueFullLocked reports whether a caller of flow must be turned away from
// e's queue (nil: the key is not live, nobody waits).
func (r *Registry[K]) queueFullLocked(e *entry[K], flow string) bool {
	if e == nil {
		return r.cfg.wait.QueueFull(0) || r.cfg.wait.FlowQueueFull(0)
	}
	q := &e.lane.Waiters
	return r.cfg.wait.QueueFull(q.Len()) ||
		r.cfg.wait.BoundFlowQueue && r.cfg.wait.FlowQueueFull(q.FlowLen(flow))
}

// waitOne queues s's hold on e and waits. Called with acquireOne's locks
// held (e's shard, or set and multiMu); it unlocks them. (Kept apart from acquireOne so that the closure below does not
// move acquireOne's variables to the heap on the fast path.)
func (r *Registry[K]) waitOne(ctx context.Context, p pending, h *core.Hold, e *entry[K], key K, place core.Place, set []int, wk *core.Wakes) (*slots.Slot, error) {
	h.Owner = e
	start := h.At
	w := core.NewWaiter(h)
	w.Seq = r.waitSeq.Add(1)
	w.Place(place)
	e.lane.Waiters.Push(&w.Elem)
	r.unlockOne(e.shard, set, wk)
	return r.await(ctx, p, w, start, e.shard, key, func(w *core.Waiter) bool { return r.withdrawOne(e, w) })
}

// TryAcquireAll is AcquireAll without waiting: it admits under every key if
// all have room, or fails with a *slots.LimitError naming the first full key.
func (r *Registry[K]) TryAcquireAll(keys ...K) (*slots.Slot, error) {
	return r.acquireAll(nil, keys)
}

// AcquireAll admits one Slot under every key, all or nothing: the Slot holds
// a unit of each key's capacity, and releasing it frees them all. While any
// key is full it waits holding nothing, in arrival order among the callers
// that can be served: callers whose keys are free go ahead of it meanwhile.
// A key listed twice counts once; with no keys it fails with ErrNoKeys.
// Failures are those of Acquire; a *slots.LimitError names the key that was
// full.
//
// Bound: while it waits, callers that came after it, of its priority class
// or a lower one, are admitted on its keys ahead of it at most MaxPassed
// times (an admission that takes several of its keys counts once). From
// then on each of its keys keeps one slot for it: such callers may still
// take a key's other free slots, never the last one, so it is served once
// every key it needs has had a slot free. Waiters that came before it, and
// callers of a higher class, go first as everywhere; a slot that a lower
// class's share (WithShare) owes that class still goes to it. Keys it does
// not need are never held back. Several such waiters on one key each keep
// a slot, the oldest served first, so none deadlocks. A TryAcquire that
// finds only a kept slot fails with slots.ErrLimitReached although the key
// shows room.
func (r *Registry[K]) AcquireAll(ctx context.Context, keys ...K) (*slots.Slot, error) {
	if ctx == nil {
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrNilContext})
		return nil, slots.ErrNilContext
	}
	return r.acquireAll(ctx, keys)
}

func (r *Registry[K]) acquireAll(ctx context.Context, keys []K) (*slots.Slot, error) {
	switch len(keys) {
	case 0:
		r.emit(slots.Event{Kind: slots.EventRejected, Err: ErrNoKeys})
		return nil, ErrNoKeys
	case 1:
		return r.acquireOne(ctx, keys[0])
	}
	for _, k := range keys {
		if err := r.checkKey(k); err != nil {
			return nil, err
		}
	}
	uniq := dedupe(keys)
	if len(uniq) == 1 {
		return r.acquireOne(ctx, uniq[0])
	}
	shs := make([]*shard[K], len(uniq))
	hashes := make([]uint64, len(uniq))
	for i, k := range uniq {
		shs[i], hashes[i] = r.shardFor(k)
		if r.limitFunc != nil {
			if err := r.refreshLimit(ctx, shs[i], k); err != nil {
				return nil, err
			}
		}
	}
	m := &multi[K]{
		r:       r,
		entries: make([]*entry[K], len(uniq)),
		idx:     make([]int32, len(uniq)),
	}
	for _, sh := range shs {
		if !slices.Contains(m.shards, sh.idx) {
			m.shards = append(m.shards, sh.idx)
		}
	}
	slices.Sort(m.shards)
	p, h := r.newHold()
	h.At = r.clk.Coarse()
	h.Owner = m
	// The class matters to this admission if any key has shares or
	// multi-key waiters; read it here, before the locks.
	var place core.Place
	if ctx != nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}

	var wk core.Wakes
	r.multiMu.Lock()
	set := r.lockBesideAll(m.shards, shs, uniq, hashes, &wk)
	unlock := func() {
		r.unlockShards(set)
		r.multiMu.Unlock()
		wk.Wake()
	}
	if endedLocked(ctx) {
		unlock()
		return nil, r.canceled(ctx)
	}
	// Decide before inserting anything: a rejection leaves no trace.
	full, fullLimit := -1, 0
	for i, k := range uniq {
		e := shs[i].lookup(k, hashes[i])
		if e != nil {
			if !admitsLocked(e, h.Class) {
				full = i
				break
			}
		} else if lim := r.limitLocked(shs[i], k); !r.freshAdmits(lim, h.Class) {
			full, fullLimit = i, lim
			break
		}
	}
	first := shs[0]
	if full < 0 {
		r.entriesLocked(m, shs, uniq, hashes)
		var counted []*core.Waiter
		for _, e := range m.entries {
			counted = passLocked(e, h.Class, newcomer, counted)
		}
		r.holdMultiLocked(h, m)
		unlock()
		return r.acquired(p, 0), nil
	}
	fullKey, fullEntry := uniq[full], shs[full].lookup(uniq[full], hashes[full])
	if ctx == nil {
		first.st.limitReached++
		err := r.rejectLocked(slots.ErrLimitReached, fullKey, fullEntry, fullLimit)
		unlock()
		r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrLimitReached})
		return nil, err
	}
	// From the key that was full on, so that a bound that every queue
	// meets (WithMaxQueue(0)) names that key, not the first one listed.
	for j := range uniq {
		i := (full + j) % len(uniq)
		k := uniq[i]
		e := shs[i].lookup(k, hashes[i])
		if r.queueFullLocked(e, place.Flow) {
			first.st.queueFull++
			err := r.rejectLocked(slots.ErrQueueFull, k, e, r.limitLocked(shs[i], k))
			unlock()
			r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrQueueFull})
			return nil, err
		}
	}
	r.entriesLocked(m, shs, uniq, hashes)
	start := h.At
	w := core.NewWaiter(h)
	w.Seq = r.waitSeq.Add(1)
	w.Place(place)
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
	unlock()
	return r.await(ctx, p, w, start, first, fullKey, func(w *core.Waiter) bool { return r.withdrawMulti(m, w) })
}

// lockBesideAll locks the shards of a multi-key admission (under multiMu)
// and, if multi-key waiters queue on any of its keys, theirs too, and
// serves what they can take now, as lockBeside does for one key. It
// returns the shards it locked.
func (r *Registry[K]) lockBesideAll(shards []int, shs []*shard[K], keys []K, hashes []uint64, wk *core.Wakes) []int {
	r.lockShards(shards)
	var beside []*entry[K]
	for i, k := range keys {
		if e := shs[i].lookup(k, hashes[i]); e != nil && e.lane.Multi > 0 {
			beside = append(beside, e)
		}
	}
	if beside == nil {
		return shards
	}
	// Their multi-key waiters leave only under multiMu: they stay live.
	r.unlockShards(shards)
	set, serve := r.lockForGrant(beside, shards)
	r.grantLocked(serve, wk)
	return set
}

// dedupe returns keys without repeats, in first-seen order.
func dedupe[K comparable](keys []K) []K {
	uniq := make([]K, 0, len(keys))
	if len(keys) <= 8 {
		for _, k := range keys {
			if !slices.Contains(uniq, k) {
				uniq = append(uniq, k)
			}
		}
		return uniq
	}
	seen := make(map[K]struct{}, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			uniq = append(uniq, k)
		}
	}
	return uniq
}

// entriesLocked fills m.entries, creating the lanes that do not exist yet.
func (r *Registry[K]) entriesLocked(m *multi[K], shs []*shard[K], keys []K, hashes []uint64) {
	for i, k := range keys {
		e := shs[i].lookup(k, hashes[i])
		if e == nil {
			e = shs[i].addLocked(r, k, hashes[i], r.limitLocked(shs[i], k))
		}
		m.entries[i] = e
	}
}

func (r *Registry[K]) holdMultiLocked(h *core.Hold, m *multi[K]) {
	for i, e := range m.entries {
		if i == 0 {
			e.shard.holdLocked(r, e, h, &m.idx[0])
		} else {
			e.lane.Holders.Add(h, &m.idx[i])
		}
	}
}

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

// await waits for w and turns the outcome into Acquire's result.
//
// start is the hold's acquire time as it was before w was queued: once
// queued, a grant may overwrite it at any moment.
func (r *Registry[K]) await(ctx context.Context, p pending, w *core.Waiter, start int64, sh *shard[K], key K, withdraw func(*core.Waiter) bool) (*slots.Slot, error) {
	var expire <-chan time.Time
	if r.cfg.wait.MaxWait > 0 {
		c, stop := r.clk.Timer(r.cfg.wait.MaxWait)
		defer stop()
		expire = c
	}
	h := w.Hold
	out := core.Await(ctx, w, expire, withdraw)
	switch out {
	case core.OutGranted:
		return r.acquired(p, time.Duration(h.At-start)), nil
	case core.OutCanceled:
		sh.mu.Lock()
		sh.st.canceled++
		sh.mu.Unlock()
		r.emit(slots.Event{Kind: slots.EventRejected, Err: ctx.Err()})
		return nil, fmt.Errorf("registry: acquire: %w", ctx.Err())
	}
	if r.cfg.wait.FailOpen {
		core.Bypass(h)
		h.At = r.clk.Coarse() // the clock start was read on
		sh.mu.Lock()
		sh.st.bypassed++
		sh.seq++
		h.ID = sh.seq<<r.shardBits | uint64(sh.idx)
		sh.mu.Unlock()
		if r.satLog.Allow(h.At, saturationLogEvery) {
			r.cfg.wait.Log().Warn("registry: key saturated; admitting without a slot (fail-open)",
				slog.String("key", keyString(key)), slog.Uint64("slot_id", h.ID),
				slog.Duration("max_wait", r.cfg.wait.MaxWait))
		}
		r.emit(slots.Event{Kind: slots.EventBypassed, Wait: time.Duration(h.At - start)})
		return p.handOut(), nil
	}
	ksh, khash := r.shardFor(key)
	if ksh != sh {
		sh.mu.Lock()
		sh.st.waitTimeouts++
		sh.mu.Unlock()
	}
	ksh.mu.Lock()
	if ksh == sh {
		sh.st.waitTimeouts++
	}
	err := r.rejectLocked(slots.ErrWaitTimeout, key, ksh.lookup(key, khash), r.limitLocked(ksh, key))
	ksh.mu.Unlock()
	r.emit(slots.Event{Kind: slots.EventRejected, Err: slots.ErrWaitTimeout})
	return nil, err
}

// emit hands e to the Observer, if there is one. Call without locks.
func (r *Registry[K]) emit(e slots.Event) {
	if r.obs != nil {
		r.obs.Observe(e)
	}
}

func (r *Registry[K]) withdrawOne(e *entry[K], w *core.Waiter) bool {
	var wk core.Wakes
	sh := e.shard
	sh.mu.Lock()
	if r.shares != nil && e.lane.Multi > 0 {
		// Serving the waiters a withdrawal may unblock takes multiMu.
		sh.mu.Unlock()
		return r.withdrawShared([]*entry[K]{e}, w, nil)
	}
	if !e.lane.Withdraw(w) {
		sh.mu.Unlock()
		return false
	}
	if r.shares != nil {
		// Its class may have stopped waiting here, and stopped keeping its
		// minimum share from the others; with no multi-key waiter (Multi
		// stays 0 under this lock) they are all served here.
		r.grantLocked([]*entry[K]{e}, &wk)
	}
	sh.dropIfIdleLocked(r, e)
	sh.mu.Unlock()
	wk.Wake()
	return true
}

// withdrawMulti withdraws a multi-key waiter. Its keys may then serve
// others at once: callers it held back once it had been passed over too
// often, and, with shares, those its class kept a minimum from.
func (r *Registry[K]) withdrawMulti(m *multi[K], w *core.Waiter) bool {
	return r.withdrawShared(m.entries, w, m)
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
		r.unlinkWaiterLocked(w, m, false)
	} else {
		entries[0].lane.Waiters.Remove(&w.Elem)
	}
	w.State = core.Gone
	r.grantLocked(serve, &wk)
	for _, e := range entries {
		e.shard.dropIfIdleLocked(r, e)
	}
	return true
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
	}
}

func (sh *shard[K]) addLocked(r *Registry[K], key K, hash uint64, limit int) *entry[K] {
	var e *entry[K]
	if sh.spare != nil {
		e, sh.spare = sh.spare, nil
	} else if n := len(sh.free); n > 0 {
		e = sh.free[n-1]
		sh.free[n-1] = nil
		sh.free = sh.free[:n-1]
	} else {
		e = &entry[K]{shard: sh}
	}
	e.key = key
	e.hash = hash
	e.lane.Limit = limit
	e.lane.Shares = r.shares
	sh.lanes.put(e, hash)
	return e
}

// holdLocked counts h as a holder of e, keeping its place in *idx.
func (sh *shard[K]) holdLocked(r *Registry[K], e *entry[K], h *core.Hold, idx *int32) {
	sh.seq++
	h.ID = sh.seq<<r.shardBits | uint64(sh.idx)
	e.lane.Holders.Add(h, idx)
}

// dropIfIdleLocked removes e once it has neither holders nor waiters.
func (sh *shard[K]) dropIfIdleLocked(r *Registry[K], e *entry[K]) {
	if e.lane.Holders.Len() > 0 || e.lane.Waiters.Len() > 0 {
		return
	}
	sh.lanes.remove(e, e.hash)
	if sh.resolved != nil {
		r.forgetLimitLocked(sh, e.key)
	}
	// The lane is empty as it stands (its holder set keeps its capacity for
	// reuse); only the key goes, so that it can be collected.
	var zero K
	e.key = zero
	if sh.spare == nil {
		sh.spare = e
	} else if len(sh.free) < maxFreeEntries {
		sh.free = append(sh.free, e)
	}
}

// Release implements core.Owner for holds of this key alone; called once
// per hold.
func (e *entry[K]) Release(h *core.Hold) bool {
	sh := e.shard
	r := sh.r
	sh.mu.Lock()
	if e.lane.Multi == 0 {
		var wk core.Wakes
		if !e.lane.Holders.Remove(h, &h.Idx) {
			sh.mu.Unlock()
			r.misuse(h) // a copied Slot: it holds nothing
			return false
		}
		sh.released++
		r.grantLocked([]*entry[K]{e}, &wk)
		sh.dropIfIdleLocked(r, e)
		sh.mu.Unlock()
		wk.Wake()
	} else {
		// Multi-key waiters queue here: serving them needs multiMu, which
		// comes before this lock. The hold stays counted meanwhile, so no
		// room shows before they can be served.
		sh.mu.Unlock()
		if !r.releaseSlow(h, []*entry[K]{e}, nil) {
			r.misuse(h) // a copied Slot: it holds nothing
			return false
		}
	}
	r.released(h)
	return true
}

// Release implements core.Owner for multi-key holds.
func (m *multi[K]) Release(h *core.Hold) bool {
	if !m.r.releaseSlow(h, m.entries, m) {
		m.r.misuse(h) // a copied Slot: it holds nothing
		return false
	}
	m.r.released(h)
	return true
}

// released samples the hold time and reports the release.
func (r *Registry[K]) released(h *core.Hold) {
	if h.ID&policy.SampleMask == 0 {
		r.hold.Observe(r.clk.Nanos() - h.At)
	}
	if r.obs != nil && !h.GivenBack {
		r.obs.Observe(slots.Event{Kind: slots.EventReleased, Hold: time.Duration(r.clk.Coarse() - h.At)})
	}
}

// releaseSlow frees h's capacity on entries (m describes a multi-key hold)
// and serves the waiters that can now be served, multi-key ones included.
// It reports false for a copied Slot, which holds nothing.
func (r *Registry[K]) releaseSlow(h *core.Hold, entries []*entry[K], m *multi[K]) bool {
	var wk core.Wakes
	defer wk.Wake() // deferred first, so it runs after every unlock
	r.multiMu.Lock()
	defer r.multiMu.Unlock()
	set, serve := r.lockForGrant(entries, nil)
	defer r.unlockShards(set)
	for i, e := range entries {
		idx := &h.Idx
		if m != nil {
			idx = &m.idx[i]
		}
		if !e.lane.Holders.Remove(h, idx) {
			// A copied Slot holds nothing; its first key shows it, and
			// nothing has been removed yet. The caller counts the misuse
			// once the locks are released.
			return false
		}
	}
	entries[0].shard.released++
	r.grantLocked(serve, &wk)
	for _, e := range entries {
		e.shard.dropIfIdleLocked(r, e)
	}
	return true
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
				if r.shares == nil && !m.urgent() {
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
	if len(entries) == 1 && entries[0].lane.Multi == 0 {
		e := entries[0]
		for {
			el := e.lane.Next()
			if el == nil {
				return
			}
			if now == 0 {
				now = r.clk.Coarse()
			}
			r.grantOneLocked(e, el.Value, now, wk)
		}
	}
	for {
		var best *core.Waiter
		var from *entry[K]
		for _, e := range entries {
			w := r.candidateLocked(e)
			if w != nil && (best == nil || core.Rank(w.Class) < core.Rank(best.Class) ||
				w.Class == best.Class && w.Seq < best.Seq) {
				best, from = w, e
			}
		}
		if best == nil {
			return
		}
		if now == 0 {
			now = r.clk.Coarse()
		}
		m, ok := best.Hold.Owner.(*multi[K])
		if !ok {
			passLocked(from, best.Class, best.Seq, nil)
			r.grantOneLocked(from, best, now, wk)
			continue
		}
		r.unlinkWaiterLocked(best, m, true)
		var counted []*core.Waiter
		for _, e := range m.entries {
			counted = passLocked(e, best.Class, best.Seq, counted)
		}
		best.Hold.At = now
		r.holdMultiLocked(best.Hold, m)
		m.entries[0].shard.st.waited++
		wk.Grant(best)
	}
}

// candidateLocked returns the waiter of e to serve next, or nil.
func (r *Registry[K]) candidateLocked(e *entry[K]) *core.Waiter {
	for _, c := range core.Order {
		if e.lane.Waiters.ClassLen(c) == 0 || !e.lane.CanTake(c) {
			continue
		}
		for el := range e.lane.Waiters.Class(c) {
			w := el.Value
			if blockedLocked(e, c, w.Seq) {
				continue
			}
			if m, ok := w.Hold.Owner.(*multi[K]); ok && !m.canTake(c, w.Seq) {
				continue
			}
			return w
		}
	}
	return nil
}

// canTake reports whether m's waiter, of class c and arrival seq, may take
// a slot of every key it needs now.
func (m *multi[K]) canTake(c uint8, seq uint64) bool {
	for _, e := range m.entries {
		if !e.lane.CanTake(c) || blockedLocked(e, c, seq) {
			return false
		}
	}
	return true
}

func (r *Registry[K]) grantOneLocked(e *entry[K], w *core.Waiter, now int64, wk *core.Wakes) {
	e.lane.Serve(w)
	w.Hold.At = now
	e.shard.holdLocked(r, e, w.Hold, &w.Hold.Idx)
	e.shard.st.waited++
	wk.Grant(w)
}

// Misuse implements core.Owner: a second Release of the same slot.
func (e *entry[K]) Misuse(h *core.Hold) { e.shard.r.misuse(h) }

// Misuse implements core.Owner.
func (m *multi[K]) Misuse(h *core.Hold) { m.r.misuse(h) }

// Time implements core.Owner.
func (e *entry[K]) Time(at int64) time.Time { return e.shard.r.clk.Time(at) }

// Time implements core.Owner.
func (m *multi[K]) Time(at int64) time.Time { return m.r.clk.Time(at) }

// Leaked implements core.Leaker: a Slot of key was dropped while held, and
// its capacity has just been reclaimed.
func (e *entry[K]) Reclaim(t *core.Tracked) { e.shard.r.reclaim(t, e) }

// Reclaim implements core.Leaker, naming the multi-key slot's first key.
func (m *multi[K]) Reclaim(t *core.Tracked) { m.r.reclaim(t, m.entries[0]) }

// reclaim frees a dropped Slot's hold and reports the leak. The key is read
// first, under its shard's lock: the hold still counts then, so e is still
// the key's entry; once freed, e may go idle and serve another key.
func (r *Registry[K]) reclaim(t *core.Tracked, e *entry[K]) {
	e.shard.mu.Lock()
	key := e.key
	e.shard.mu.Unlock()
	if t.ReleaseQuietly() {
		r.leaked(t, key)
	}
}

func (r *Registry[K]) leaked(t *core.Tracked, key K) {
	held := time.Duration(r.clk.Coarse() - t.At)
	r.leaks.Add(1)
	attrs := []any{slog.String("key", keyString(key)), slog.Uint64("slot_id", t.ID),
		slog.Duration("held_for", held.Round(time.Millisecond))}
	if site := t.Site(); site != "" {
		attrs = append(attrs, slog.String("acquired_at", site))
	}
	r.cfg.wait.Log().Warn("registry: slot dropped without Release; capacity reclaimed", attrs...)
	r.emit(slots.Event{Kind: slots.EventLeaked, Hold: held})
}

func (r *Registry[K]) misuse(h *core.Hold) {
	r.doubleReleases.Add(1)
	r.emit(slots.Event{Kind: slots.EventDoubleRelease})
	r.cfg.wait.Log().Debug("registry: slot released twice", slog.Uint64("slot_id", h.ID))
}

func (r *Registry[K]) rejectLocked(reason error, key K, e *entry[K], limit int) error {
	le := &slots.LimitError{Err: reason, Key: keyString(key), Limit: limit}
	if e != nil {
		le.InFlight = e.lane.Holders.Len()
		le.Queued = e.lane.Waiters.Len()
		le.Limit = e.lane.Limit
	}
	le.RetryAfter = r.hold.RetryAfter(le.Queued, le.Limit)
	return le
}

// keyString formats a key for errors and logs, cut to a readable length.
func keyString[K comparable](key K) string {
	const max = 256
	var s string
	if ks, ok := any(key).(string); ok {
		s = ks
	} else {
		s = fmt.Sprint(key)
	}
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}
