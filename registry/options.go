package registry

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// An Option configures a Registry: the wait options of package slots
// (slots.WithMaxWait, slots.WithObserver, ...), which a Registry takes as a
// Limiter does, or this package's own (WithShards, WithMaxKeyBytes,
// WithLimitFunc), which a Limiter refuses.
type Option = slots.Option

// registryOption is an option of a Registry alone, named for the panic of a
// Limiter given it.
type registryOption struct {
	name string
	set  func(*core.Settings)
}

func (o registryOption) Apply(s *core.Settings) {
	if s.RegistryOnly == "" {
		s.RegistryOnly = o.name
	}
	o.set(s)
}

// DefaultShards is the number of lock shards unless WithShards says otherwise.
const DefaultShards = 64

// DefaultMaxKeyBytes bounds string keys unless WithMaxKeyBytes says otherwise.
const DefaultMaxKeyBytes = 4096

// WithMaxWait bounds how long Acquire and AcquireAll wait. When d passes they
// fail with slots.ErrWaitTimeout, or with WithFailOpen admit a Bypassed slot.
// d <= 0 (the default) waits until the context ends.
func WithMaxWait(d time.Duration) Option { return slots.WithMaxWait(d) }

// WithMaxQueue bounds how many callers may wait on one key at once; when n are
// waiting, the newest is rejected at once with slots.ErrQueueFull. n = 0 means
// never wait. The default is no bound; a negative n restores it.
func WithMaxQueue(n int) Option { return slots.WithMaxQueue(n) }

// WithFailOpen makes a wait that reaches WithMaxWait proceed with a Bypassed
// slot (no capacity held) instead of failing; counted in Stats and logged as
// saturation at most once every 10 seconds.
func WithFailOpen() Option { return slots.WithFailOpen() }

// WithClock sets the clock for acquire times, the maximum wait and limit
// refreshes; for tests. The default is the real clock.
func WithClock(clk clock.Clock) Option { return slots.WithClock(clk) }

// WithLogger sets the logger for warnings. nil (the default) means
// slog.Default(), looked up each time a line is logged. Warnings name keys and
// slot ids only.
func WithLogger(l *slog.Logger) Option { return slots.WithLogger(l) }

// MaxShards bounds WithShards.
const MaxShards = 1 << 16

// WithShards sets the number of lock shards, rounded up to a power of two and
// at most MaxShards. More shards let unrelated keys contend less; each costs
// about 250 bytes, plus 128 bytes of index once used. It panics if n < 1.
func WithShards(n int) Option {
	if n < 1 {
		panic(fmt.Sprintf("registry: WithShards(%d): need at least one shard", n))
	}
	return registryOption{"registry.WithShards", func(s *core.Settings) { s.Shards = n }}
}

// WithMaxKeyBytes bounds the length of keys whose type is a string type:
// longer keys are rejected with ErrInvalidKey and insert nothing. The default
// is DefaultMaxKeyBytes; n <= 0 removes the bound. Other key types are hashed
// and compared as Go map keys are, at a cost that grows with their size.
func WithMaxKeyBytes(n int) Option {
	return registryOption{"registry.WithMaxKeyBytes", func(s *core.Settings) { s.MaxKeyBytes = n }}
}

// LimitRetention is how many refresh intervals an idle key's fetched limit is
// kept (see WithLimitFunc).
const LimitRetention = 10

// LimitFunc resolves a key's limit, for example an organisation's limit from a
// database. It is called without any registry lock held, with the caller's
// context (context.Background for TryAcquire), and may be called concurrently.
type LimitFunc[K comparable] func(ctx context.Context, key K) (int, error)

// WithLimitFunc resolves limits of keys that SetLimit has not set: a key's
// limit is fetched when it is first needed and again, on a later acquire,
// once it is older than refresh.
//
// One fetch per key runs at a time. Callers that find the key's first fetch
// under way wait for it (or for their context), so a burst on a new key is
// capped by the fetched limit, not the default; callers that find a refresh
// under way use the last known limit. TryAcquire and TryAcquireAll may
// therefore wait for fn. When fn fails, returns a negative limit, or panics,
// the last limit it returned for the key stays in force and the fetch is
// retried on a later acquire; a key never fetched successfully gets the
// default limit for that call only, so a fallback is never cached.
//
// A key's last fetched limit is kept while the key is live and until it is
// LimitRetention refresh intervals old, so an idle tenant that comes back
// while the source is down keeps its own limit; after that it is forgotten
// (by the first acquire on its lock shard a refresh interval after the last
// prune, at most), and the memory goes with it: the cache holds only keys
// used recently.
//
// New panics if refresh <= 0 or fn's key type is not the registry's.
func WithLimitFunc[K comparable](fn LimitFunc[K], refresh time.Duration) Option {
	return registryOption{"registry.WithLimitFunc", func(s *core.Settings) { s.LimitFunc, s.Refresh = fn, refresh }}
}

// WithObserver sets an Observer of admissions, rejections and releases, for
// metrics (see slots.Observer): events name no key. The default is none,
// which costs nothing.
func WithObserver(o slots.Observer) Option { return slots.WithObserver(o) }

// WithLeakDetection makes a Slot that is dropped without Release, and
// collected while still held, give its capacity back; the leak is logged
// (key, slot id, how long it was held) and reported as slots.EventLeaked.
// A safety net for a missed Release, not a way to release: the collector
// runs when it will. It costs one more allocation and a cleanup registration
// per admission, so it is off by default; turn it on in tests and where
// leaks are suspected.
//
// Do not use it with testing/synctest bubbles in which callers wait for
// slots: the runtime runs cleanups outside every bubble, and a reclaimed slot
// granted to a waiter inside one wakes that waiter from outside, which the
// runtime treats as a fatal error.
func WithLeakDetection() Option { return slots.WithLeakDetection() }

// WithLeakSites is WithLeakDetection that also records where each slot was
// acquired (the caller's stack, about a microsecond per admission), and names
// that place in the leak warning.
func WithLeakSites() Option { return slots.WithLeakSites() }

// WithShare guarantees priority class p the share s of every key's limit
// (see slots.Share and slots.WithShare). With shares, Acquire and
// AcquireAll read the priority from the context on every call; TryAcquire
// and TryAcquireAll admit as slots.PriorityDefault. It panics if a count is
// negative.
func WithShare(p slots.Priority, s slots.Share) Option { return slots.WithShare(p, s) }

// WithMaxQueuePerFlow bounds how many callers of one flow (slots.WithFlow)
// may wait on one key at once: the flow's newest caller beyond n is rejected
// with slots.ErrQueueFull while other flows still queue. Callers without a
// flow form the flow "". The default is no bound; a negative n restores it.
func WithMaxQueuePerFlow(n int) Option { return slots.WithMaxQueuePerFlow(n) }
