package registry_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// With a refresh under a second, an idle key's limit is kept past its
// LimitRetention intervals until the next prune, at most a second after the
// last (as NewWithLimitFunc's doc says), and then forgotten by an acquire
// of any key: the sweep of quiet shards.
func TestShortRefreshIdleLimitForgottenWithinASecond(t *testing.T) {
	mock := clock.NewMock()
	fetch := func(context.Context, string) (int, error) { return 2, nil }
	reg := registry.NewWithLimitFunc[string](1, fetch, time.Millisecond, slots.WithClock(mock))
	use := func(key string) {
		s, err := reg.TryAcquire(key)
		require.NoError(t, err)
		s.Release()
	}
	const n = 50
	for i := range n {
		use(fmt.Sprintf("idle-%d", i)) // retained as they go idle
	}
	require.Equal(t, n, reg.CachedLimits())
	mock.Add(20 * time.Millisecond) // twice LimitRetention intervals
	use("other")
	assert.Greater(t, reg.CachedLimits(), 1, "not pruned yet: within a second of the last prune")
	mock.Add(time.Second)
	use("other")
	assert.LessOrEqual(t, reg.CachedLimits(), 1, "forgotten by the first acquire a second after the last prune")
}

// A stream of new keys, one a refresh interval (1 ms): the prune on the
// cache's doubling keeps it within a few times what is retained (the keys
// of the last LimitRetention intervals), though the timed prune comes only
// once a second.
func TestShortRefreshBurstStaysBounded(t *testing.T) {
	mock := clock.NewMock()
	fetch := func(context.Context, string) (int, error) { return 2, nil }
	reg := registry.NewWithLimitFunc[string](1, fetch, time.Millisecond, slots.WithClock(mock), registry.WithShards(1))
	most := 0
	for i := range 1000 {
		mock.Add(time.Millisecond)
		s, err := reg.TryAcquire(fmt.Sprintf("k-%d", i))
		require.NoError(t, err)
		s.Release()
		most = max(most, reg.CachedLimits())
	}
	t.Logf("at most %d limits cached", most)
	assert.LessOrEqual(t, most, 2*(registry.LimitRetention+1)+64)
}
