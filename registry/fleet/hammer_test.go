package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// A hammer on the fleet's queue, on a real redis-server: three Registries,
// callers of every class and several flows mixing Acquire, AcquireAll and
// TryAcquire on a provider key and two model keys, with contexts that end
// at random (before, during and after their grants). An independent count
// per key, taken while the Slot is held, never exceeds its cap; every
// caller that waits long enough is admitted; at the end nothing is held
// or queued in Redis.
func TestFleetQueueHammer(t *testing.T) {
	srv := redistest.Start(t)
	caps := map[string]int{"p": 3, "m1": 2, "m2": 1}
	var rs []*Registry[string]
	for range 3 {
		r := New[string](redisstore.New(srv.Client(), "hammer"), 0, WithLeaseTTL(3*time.Second),
			WithLocalOptions(slots.WithMaxQueue(40), slots.WithMaxQueuePerFlow(20)))
		for k, n := range caps {
			r.SetLimit(k, n)
		}
		t.Cleanup(r.Close)
		rs = append(rs, r)
	}
	var held [3]atomic.Int64 // p, m1, m2
	idx := map[string]int{"p": 0, "m1": 1, "m2": 2}
	var over, admitted, cancelled, refused atomic.Int64
	hold := func(keys []string) {
		for _, k := range keys {
			if n := held[idx[k]].Add(1); n > int64(caps[k]) {
				over.Add(1)
				t.Errorf("%s: %d held, over its cap of %d", k, n, caps[k])
			}
		}
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // the request's work
		for _, k := range keys {
			held[idx[k]].Add(-1)
		}
	}
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := range 24 {
		r := rs[g%3]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(stop) {
				keys := []string{"p"}
				if rng.IntN(2) == 0 {
					keys = append(keys, fmt.Sprint("m", 1+rng.IntN(2)))
				}
				ctx := slots.WithPriority(context.Background(), slots.Priority(rng.IntN(3)-1))
				ctx = slots.WithFlowWeight(ctx, fmt.Sprint("f", rng.IntN(4)), 1+rng.IntN(3))
				var cancel context.CancelFunc = func() {}
				if rng.IntN(3) == 0 { // a context that ends at a random moment
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(20))*time.Millisecond)
				}
				var s *slots.Slot
				var err error
				switch rng.IntN(5) {
				case 0:
					s, err = r.TryAcquireAll(keys...)
				default:
					s, err = r.AcquireAll(ctx, keys...)
				}
				cancel()
				switch {
				case err == nil:
					admitted.Add(1)
					hold(keys)
					s.Release()
				case errors.Is(err, context.DeadlineExceeded):
					cancelled.Add(1)
				case errors.Is(err, slots.ErrLimitReached), errors.Is(err, slots.ErrQueueFull):
					refused.Add(1)
				default:
					t.Errorf("unexpected error: %v", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("admitted %d, cancelled %d, refused %d", admitted.Load(), cancelled.Load(), refused.Load())
	assert.Zero(t, over.Load())
	assert.Positive(t, admitted.Load())
	assert.Positive(t, cancelled.Load(), "some contexts ended while waiting")
	// Nothing left held or queued in Redis once the removals are through.
	ctx := context.Background()
	rdb := srv.Client()
	require.Eventually(t, func() bool {
		for k := range caps {
			for _, suffix := range []string{"", "#q"} {
				if n, err := rdb.ZCard(ctx, "inflight:{hammer}:"+k+suffix).Result(); err != nil || n != 0 {
					return false
				}
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "every lease released and every waiter gone from the queues")
	for _, r := range rs {
		st := r.Stats()
		assert.Zero(t, st.Held)
		assert.Zero(t, st.Waiting)
	}
}
