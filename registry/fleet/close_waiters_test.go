package fleet

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// Waiters queued in the store as Close comes, the store hanging (and the
// breaker not open yet): each takes its place back within a call timeout,
// as a Release racing Close does (removeAfterStop), not one after another.
// Each sent its abandon alone under storeMu, waiting for the ones before
// it: the k-th waiter returned ErrClosed after k call timeouts (5 s for
// 10 waiters).
func TestWaitersLeaveWithinACallTimeoutAtCloseWhenTheStoreHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 10
		st := &hangsAtClose{Store: memstore.New(), arrived: make(chan struct{})}
		r := New[string](st, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		held, err := r.TryAcquire("k")
		require.NoError(t, err)
		returned := make(chan time.Time, n)
		for range n {
			go func() {
				_, err := r.Acquire(context.Background(), "k")
				assert.ErrorIs(t, err, ErrClosed)
				returned <- time.Now()
			}()
		}
		synctest.Wait()
		require.Equal(t, n, r.Stats().Waiting)
		st.hang.Store(true)
		start := time.Now()
		r.Close()
		var longest time.Duration
		for range n {
			longest = max(longest, (<-returned).Sub(start))
		}
		t.Logf("longest wait after Close: %v; %d Abandon calls", longest, st.abandons.Load())
		assert.LessOrEqual(t, longest, 2*500*time.Millisecond, "each waiter leaves within about a call timeout")
		held.Release()
	})
}
