package registry_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// 10^5 keys used once, then idle: their cached limits go once they are
// LimitRetention refresh intervals old, and the memory with them, as the
// registry goes on being used (a few new keys arriving).
func TestIdleKeysCachedLimitsAreDropped(t *testing.T) {
	mock := clock.NewMock()
	fetch := func(context.Context, string) (int, error) { return 2, nil }
	const refresh = time.Minute
	reg := registry.NewWithLimitFunc[string](1, fetch, refresh, slots.WithClock(mock))
	use := func(key string) {
		s, err := reg.TryAcquire(key)
		require.NoError(t, err)
		s.Release()
	}
	before := heapAfterGC()
	const n = 100_000
	for i := range n {
		use(fmt.Sprintf("tenant-%08d", i))
	}
	require.Equal(t, n, reg.CachedLimits(), "recent limits outlive their keys")
	burst := heapAfterGC()
	t.Logf("heap: %.1f MiB before, %.1f MiB after the burst", mib(before), mib(burst))

	// Fifteen refresh intervals with a trickle of new keys.
	for i := range 15 * 60 {
		mock.Add(time.Second)
		use(fmt.Sprintf("late-%d", i))
	}
	after := heapAfterGC()
	t.Logf("heap: %.1f MiB fifteen intervals later, %d limits cached", mib(after), reg.CachedLimits())
	// A key a second: those of the last LimitRetention intervals are kept,
	// and at most one interval's more that no prune has reached yet.
	assert.LessOrEqual(t, reg.CachedLimits(), (registry.LimitRetention+1)*60, "only recent keys' limits are kept")
	assert.Less(t, after, before+2<<20, "the memory of the burst is given back (within 2 MiB)")
	runtime.KeepAlive(reg)
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// With a short refresh interval and many live keys, the cache of fetched
// limits is not walked on every acquire: the prunes of idle keys' limits
// come at most once a second (or a refresh interval, if longer), so that
// the entries walked stay within a few times the acquires made. Before,
// with a 1 ms refresh, each acquire a millisecond after the last walked
// its shard's live keys, and the sweep of quiet shards walked every shard:
// all 2,000 live keys walked per acquire here.
func TestShortRefreshDoesNotWalkLiveKeysPerAcquire(t *testing.T) {
	mock := clock.NewMock()
	fetch := func(context.Context, string) (int, error) { return 2, nil }
	reg := registry.NewWithLimitFunc[string](1, fetch, time.Millisecond, slots.WithClock(mock))
	const live = 2000
	for i := range live {
		s, err := reg.TryAcquire(fmt.Sprintf("tenant-%05d", i))
		require.NoError(t, err)
		defer s.Release()
	}
	walked := 0
	at, _ := reg.PrunedAt()
	const acquires = 300 // three seconds, an acquire every 10 ms
	for i := range acquires {
		mock.Add(10 * time.Millisecond)
		s, err := reg.TryAcquire(fmt.Sprintf("tenant-%05d", i%live))
		require.NoError(t, err)
		s.Release()
		now, kept := reg.PrunedAt()
		for sh := range now {
			if now[sh] != at[sh] {
				walked += kept[sh]
			}
		}
		at = now
	}
	t.Logf("%d acquires over %d live keys walked %d cached limits", acquires, live, walked)
	assert.LessOrEqual(t, walked, 4*(acquires+live), "entries walked by prunes")
	assert.Equal(t, live, reg.CachedLimits(), "a live key's limit is kept")
}
