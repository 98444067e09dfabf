package fleet

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
)

// Waiters of two processes queued in the fleet's queue keep their order
// across a pause of new admissions (here after the store lost its epoch),
// which lasts longer than a process's liveness in the store (5 claim
// windows), the holder releasing meanwhile: they ask within a claim
// window, and their paused asks keep their processes alive. Before, they
// slept until the pause's end, the first serving after it dropped every
// ticket as a dead process's, and they queued again in whatever order
// their asks came (one process's waiters, then the other's). On a virtual
// Redis in virtual time.
func TestWaitersKeepTheirOrderAcrossAPause(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		v := newVirtualRedis(t, fwLatency)
		rs := fwFleet(t, v, "paused-order", 2, 1, WithLogger(quiet()))
		require.Greater(t, rs[0].pause, 5*rs[0].claim, "the pause outlasts a process's liveness")
		held, err := rs[0].TryAcquire("k")
		require.NoError(t, err)
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		const waiters = 6
		for i := range waiters {
			name := fmt.Sprint("w", i)
			wg.Go(func() {
				s, err := rs[i%2].Acquire(context.Background(), "k")
				if !assert.NoError(t, err, name) {
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				s.Release()
			})
			fwUntil(t, name+" queued in the store", func() bool {
				m, _ := v.srv.ZMembers("inflight:{paused-order}:k#q")
				return len(m) == i+1
			})
		}
		v.srv.Del("inflight:{paused-order}#epoch") // the next call that knew it pauses admissions
		fwUntil(t, "the pause declared", func() bool { return v.srv.Exists("inflight:{paused-order}#pause") })
		held.Release() // serves nobody while paused: the first call after the pause does
		wg.Wait()
		assert.Equal(t, []string{"w0", "w1", "w2", "w3", "w4", "w5"}, order)
		assert.Positive(t, rs[0].Stats().Paused+rs[1].Stats().Paused, "the waiters met the pause")
	})
}
