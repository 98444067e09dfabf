package registry

import (
	"context"
	"fmt"

	"github.com/inflight-go/inflight/internal/core"
)

// An Option configures a Registry: any option of package slots
// (slots.WithMaxWait, slots.WithObserver, ...), which a Registry takes as a
// Limiter does, or this package's own (WithShards, WithMaxKeyBytes), which
// a Limiter does not take. A nil one is ignored. Options kept in a slice
// for both a Limiter and a Registry go in a []registry.Option for the
// Registry: a []slots.Option does not spread into New.
type Option interface {
	// Apply is for this module's packages; use the With functions.
	Apply(*core.Settings)
}

// registryOption is an option of a Registry alone.
type registryOption func(*core.Settings)

func (o registryOption) Apply(s *core.Settings) { o(s) }

// DefaultShards is the number of lock shards unless WithShards says otherwise.
const DefaultShards = 64

// DefaultMaxKeyBytes bounds string keys unless WithMaxKeyBytes says otherwise.
const DefaultMaxKeyBytes = 4096

// MaxShards bounds WithShards.
const MaxShards = 1 << 16

// WithShards sets the number of lock shards, rounded up to a power of two and
// at most MaxShards. More shards let unrelated keys contend less; each costs
// about 250 bytes, plus 128 bytes of index once used. It panics if n < 1.
func WithShards(n int) Option {
	if n < 1 {
		panic(fmt.Sprintf("registry: WithShards(%d): need at least one shard", n))
	}
	return registryOption(func(s *core.Settings) { s.Shards = n })
}

// WithMaxKeyBytes bounds the length of keys whose type is a string type:
// longer keys are rejected with ErrInvalidKey and insert nothing. The default
// is DefaultMaxKeyBytes; n <= 0 removes the bound. Other key types are hashed
// and compared as Go map keys are, at a cost that grows with their size.
func WithMaxKeyBytes(n int) Option {
	return registryOption(func(s *core.Settings) { s.MaxKeyBytes = n })
}

// LimitRetention is how many refresh intervals an idle key's fetched limit is
// kept (see NewWithLimitFunc).
const LimitRetention = 10

// LimitFunc resolves a key's limit, for example an organisation's limit from a
// database. It is called without any registry lock held, with the caller's
// context (context.Background for TryAcquire), and may be called concurrently.
type LimitFunc[K comparable] func(ctx context.Context, key K) (int, error)
