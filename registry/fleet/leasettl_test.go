package fleet

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// A lease TTL out of bounds panics at the option, as one under 30 ms does:
// math.MaxInt64, meant as "never expires", put a lease's expiry on Redis
// before the store's clock, so the lease counted for nothing and the cap
// did not hold. The bounds themselves are taken.
func TestLeaseTTLBounds(t *testing.T) {
	for _, ttl := range []time.Duration{MaxLeaseTTL + 1, math.MaxInt64, 29 * time.Millisecond, -1} {
		assert.Panics(t, func() { WithLeaseTTL(ttl) }, "%v", ttl)
	}
	for _, ttl := range []time.Duration{30 * time.Millisecond, MaxLeaseTTL} {
		assert.NotPanics(t, func() { WithLeaseTTL(ttl) }, "%v", ttl)
	}
	// The longest TTL holds the cap across processes, on a virtual Redis.
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		rs := fwFleet(t, srv, "ttl", 2, 1, WithLeaseTTL(MaxLeaseTTL), WithLogger(quiet()))
		s, err := rs[0].TryAcquire("k")
		require.NoError(t, err)
		time.Sleep(time.Minute)
		_, err = rs[1].TryAcquire("k")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "the lease counts")
		s.Release()
		fwUntil(t, "the release reaches the store", func() bool {
			n, err := rs[1].InFlight(context.Background(), "k")
			return err == nil && n == 0
		})
	})
}
