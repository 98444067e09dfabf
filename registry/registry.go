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
// TryAcquireN, AcquireN and AcquireAllN admit a Slot that weighs n units
// (a request's tokens) where a plain admission weighs one: a key's limit
// and in-flight count are then in units.
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
	"math/bits"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/ilist"
)

var (
	// ErrInvalidKey: the key is over the WithMaxKeyBytes bound.
	ErrInvalidKey = core.ErrInvalidKey
	// ErrNoKeys: AcquireAll or TryAcquireAll was given no key.
	ErrNoKeys = errors.New("registry: no keys")
)

// Registry caps holders per key. Create it with New; the zero value is not
// usable.
type Registry[K comparable] struct {
	eng          core.Engine
	defaultLimit int
	maxKeyBytes  int
	seed         maphash.Seed
	shards       []shard[K]
	shardBits    uint
	stringKeys   bool // K is a string type, bounded by maxKeyBytes
	limitFunc    LimitFunc[K]
	refresh      time.Duration // of limitFunc's limits
	pruneEvery   int64         // the refresh interval, and at least a second (pruneResolvedLocked)

	// multiMu serialises everything that involves a waiter needing several
	// keys: AcquireAll, the release or limit change of a key such waiters
	// queue on, and their withdrawal. It is taken before any shard lock;
	// shard locks are taken in ascending index order.
	multiMu sync.Mutex

	// Written now and then; kept off the cache line of the read-mostly
	// fields above, which every admission on every core reads.
	_           [64]byte
	waitSeq     atomic.Uint64 // arrival order of waiters
	invalidKeys atomic.Uint64
	// exceedsLimit counts the refusals of callers heavier than a key's
	// limit: rare, so kept here rather than in each shard's counters.
	exceedsLimit atomic.Uint64
	sweepAt      atomic.Int64 // when the next acquire prunes idle shards' caches (refreshLimit)
	limitLog     core.Every
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
	// entries or pruneEvery after prunedAt (clock nanos), and made
	// anew when it has shrunk well below resolvedPeak (pruneResolvedLocked).
	pruneAt      int
	prunedAt     int64
	resolvedPeak int
	fetched      uint64 // successful fetches of the shard's keys' limits (resolved.gen)
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
	at    int64     // clock nanos of the last successful fetch
	ok    bool      // n came from a successful fetch
	fetch *fetching // non-nil while a fetch runs
	gen   uint64    // the shard's count of successful fetches at its last, so a late one yields
	again bool      // RefreshLimits came while a fetch ran: what it read may be older
}

// fetching is a fetch under way: done is closed when it ends, and n (the
// limit fetched, -1 if it failed) and left are set before that; left if it
// failed as its caller's context ended (which says nothing of the limit:
// those waiting fetch again). It stays with those waiting for it, whatever
// becomes of the key's record (a prune may drop it before they take it).
type fetching struct {
	done chan struct{}
	n    int
	left bool
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
	// urgent counts those of them passed over MaxPassed times, which keep
	// units of the key (blockedLocked). Guarded by multiMu, as their
	// passed counts are.
	urgent int
}

const maxFreeEntries = 32

// New returns a Registry in which every key may have defaultLimit holders
// at once unless SetLimit says otherwise. slots.Unlimited is a default that
// never binds. It takes the wait options of package slots (slots.WithMaxWait,
// slots.WithObserver, ...) and this package's own. It panics if
// defaultLimit is negative.
func New[K comparable](defaultLimit int, opts ...Option) *Registry[K] {
	if defaultLimit < 0 {
		panic(fmt.Sprintf("registry: negative default limit %d", defaultLimit))
	}
	st := core.Settings{Shards: DefaultShards, MaxKeyBytes: DefaultMaxKeyBytes}
	core.Apply(&st, opts)
	// 1<<shardBits shards: as many as asked, rounded up to a power of two.
	shardBits := uint(bits.Len(uint(min(st.Shards, MaxShards) - 1)))
	r := &Registry[K]{
		eng:          core.Engine{Policy: st.Policy, SampleShift: shardBits},
		defaultLimit: defaultLimit,
		maxKeyBytes:  st.MaxKeyBytes,
		stringKeys:   reflect.TypeFor[K]().Kind() == reflect.String,
		seed:         maphash.MakeSeed(),
		shards:       make([]shard[K], 1<<shardBits),
		shardBits:    shardBits,
	}
	r.eng.Init("registry", asError)
	for i := range r.shards {
		r.shards[i].idx = i
		r.shards[i].lanes.shift = uint32(r.shardBits)
		r.shards[i].r = r
	}
	return r
}

// NewWithLimitFunc is New for keys whose limits come from fn, for example an
// organisation's limit from a database, unless SetLimit sets one: a key's
// limit is fetched when it is first needed and again, on a later acquire,
// once it is older than refresh.
//
// One fetch per key runs at a time. Callers that find the key's first fetch
// under way wait for it (or for their context), so a burst on a new key is
// capped by the fetched limit, not the default (should the fetch fail
// because its caller's context ended, one of them fetches again); callers
// that find a refresh under way use the last known limit. TryAcquire and
// TryAcquireAll may therefore wait for fn. When fn fails, returns a negative limit, or panics,
// the last limit it returned for the key stays in force and the fetch is
// retried on a later acquire; a key never fetched successfully gets
// defaultLimit for that call only, so a fallback is never cached.
//
// A key's last fetched limit is kept while the key is live and until it is
// LimitRetention refresh intervals old, so an idle tenant that comes back
// while the source is down keeps its own limit; after that it is forgotten
// (by the first acquire on its lock shard a refresh interval, and at least
// a second, after the last prune), and the memory goes with it: the cache holds only keys
// used recently. RefreshLimits makes chosen keys fetch again at once.
//
// It panics if defaultLimit is negative, fn is nil or refresh <= 0.
func NewWithLimitFunc[K comparable](defaultLimit int, fn LimitFunc[K], refresh time.Duration, opts ...Option) *Registry[K] {
	if fn == nil {
		panic("registry: NewWithLimitFunc needs a LimitFunc")
	}
	if refresh <= 0 {
		panic(fmt.Sprintf("registry: NewWithLimitFunc needs a positive refresh interval, got %v", refresh))
	}
	r := New[K](defaultLimit, opts...)
	r.limitFunc, r.refresh, r.pruneEvery = fn, refresh, max(int64(refresh), int64(time.Second))
	r.eachShard(func(sh *shard[K]) { sh.resolved = map[K]resolved{} })
	return r
}

// equalsItself is false for a key that no map lookup could find again (it
// holds a NaN) or that cannot be hashed (it holds an uncomparable value).
func equalsItself[K comparable](k K) (ok bool) {
	defer func() { recover() }() // a panic leaves ok false
	return k == k
}

// hashable is false for a key that CheckKey refuses as unequal to itself
// or not comparable (shardFor would panic on an interface holding a
// slice): a read of one finds nothing.
func (r *Registry[K]) hashable(key K) bool { return r.stringKeys || equalsItself(key) }

// shardFor returns key's shard and hash; the hash also indexes the shard's
// table, so a key is hashed once per operation.
func (r *Registry[K]) shardFor(key K) (*shard[K], uint64) {
	h := maphash.Comparable(r.seed, key)
	return &r.shards[h&uint64(len(r.shards)-1)], h
}

// eachShard calls fn with each shard in turn, under that shard's lock,
// which a panic of fn (RefreshLimits' match is the caller's) releases.
func (r *Registry[K]) eachShard(fn func(*shard[K])) {
	for i := range r.shards {
		func(sh *shard[K]) {
			sh.mu.Lock()
			defer sh.mu.Unlock()
			fn(sh)
		}(&r.shards[i])
	}
}

// checkKey is CheckKey for an admission: a bad key is a counted rejection.
func (r *Registry[K]) checkKey(ctx context.Context, key K) error {
	err := r.CheckKey(key)
	if err != nil {
		r.invalidKeys.Add(1)
		r.eng.Rejected(ctx, ErrInvalidKey, 0)
	}
	return err
}

// CheckKey returns an error wrapping ErrInvalidKey if admissions would
// refuse key: over the WithMaxKeyBytes bound, or unequal to itself (it
// holds a NaN) or not comparable; nil otherwise. Admissions check it
// themselves; it is for a layer that must refuse a key before it passes the
// key on (as package registry/fleet does before it goes to Redis).
//
// It refuses the keys that a map could never find again: a NaN (or a
// struct or interface holding one) is unequal to itself, and an interface
// holding a slice cannot be hashed at all.
func (r *Registry[K]) CheckKey(key K) error {
	s, str := any(key).(string) // the common key type
	n := len(s)
	if !str && r.stringKeys && r.maxKeyBytes > 0 {
		n = reflect.ValueOf(key).Len()
	}
	if r.maxKeyBytes > 0 && n > r.maxKeyBytes {
		return fmt.Errorf("%w: %d bytes, over the %d-byte bound", ErrInvalidKey, n, r.maxKeyBytes)
	}
	if !str && !r.stringKeys && !equalsItself(key) { // a string holds no NaN
		return fmt.Errorf("%w: the key is not equal to itself (NaN) or not comparable", ErrInvalidKey)
	}
	return nil
}

// limitLocked returns the limit a key without a lane would start with:
// its override, its fetched limit, or fetched (the one the caller's
// refreshLimit resolved, if any: the key's record may have been pruned
// since), or the default.
func (r *Registry[K]) limitLocked(sh *shard[K], key K, fetched int) int {
	// The lengths first: most registries have neither, and the two lookups
	// cost about 20 ns of an admission even in empty maps
	// (BenchmarkRegistryTryAcquireRelease: 103 ns with them, 83 without).
	if len(sh.overrides) > 0 {
		if n, ok := sh.overrides[key]; ok {
			return n
		}
	}
	if len(sh.resolved) > 0 {
		if rv, ok := sh.resolved[key]; ok && rv.ok {
			return rv.n
		}
	}
	if fetched >= 0 {
		return fetched
	}
	return r.defaultLimit
}
