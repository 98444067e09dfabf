package registry_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
)

// Waiters of AcquireAll on a paused key (limit 0) keep nothing of their
// other keys, however often they are passed over: they cannot be served
// until the pause is lifted. Found by a bug hunt: once passed over
// registry.MaxPassed times, each kept its units of the provider key, and
// as many of them as the provider's limit stopped every other model's
// traffic on an idle provider (TryAcquireAll refused with 0 in flight,
// AcquireAll waited out its context). Once the pause is lifted they are
// served.
func TestPausedKeysWaitersKeepNothing(t *testing.T) {
	for _, limit := range []int{1, 3} {
		testrig.Bubble(t, func(t *testing.T) {
			reg := registry.New[string](limit)
			reg.SetLimit("m1", 0) // paused
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan error, limit)
			for range limit {
				go func() {
					s, err := reg.AcquireAll(ctx, "p", "m1")
					if err == nil {
						s.Release()
					}
					served <- err
				}()
			}
			synctest.Wait()
			require.Equal(t, limit, reg.Waiting("m1"))
			for i := range 5 * registry.MaxPassed {
				s, err := reg.TryAcquireAll("p", "m2")
				require.NoError(t, err, "admission %d of p and m2 while m1 is paused", i+1)
				s.Release()
			}
			wctx, wcancel := context.WithTimeout(context.Background(), time.Hour)
			defer wcancel()
			s, err := reg.AcquireAll(wctx, "p", "m2")
			require.NoError(t, err, "(p, m2) waits on an idle provider")
			s.Release()

			reg.SetLimit("m1", limit)
			synctest.Wait()
			for range limit {
				assert.NoError(t, <-served, "served once the pause is lifted")
			}
			assert.Zero(t, reg.Keys())
		})
	}
}

// A waiter that keeps a unit of the provider key stops keeping it when
// its other key is paused: a caller that waited behind the kept unit is
// served at once.
func TestPauseFreesWhatAWaiterKept(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](1)
		stream, err := reg.TryAcquire("m1") // m1 full
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _, _ = reg.AcquireAll(ctx, "p", "m1") }()
		synctest.Wait()
		for range registry.MaxPassed {
			s, err := reg.TryAcquireAll("p", "m2")
			require.NoError(t, err)
			s.Release()
		}
		_, err = reg.TryAcquireAll("p", "m2")
		require.Error(t, err, "p's one unit kept for the waiter on m1")
		got := make(chan error, 1)
		go func() {
			s, err := reg.AcquireAll(ctx, "p", "m2")
			if err == nil {
				s.Release()
			}
			got <- err
		}()
		synctest.Wait()
		require.Empty(t, got)

		reg.SetLimit("m1", 0)
		synctest.Wait()
		require.Len(t, got, 1, "served once m1 is paused")
		assert.NoError(t, <-got)
		cancel()
		stream.Release()
		synctest.Wait()
		assert.Zero(t, reg.Keys())
	})
}
