package registry_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Beside a heavy waiter that the free units do not fit, a newcomer of the
// key alone that they do fit is served, as on a Limiter, though the
// queue's bound is reached: the queue is served, in order, before the
// bound turns the newcomer away. A Registry refused it (queue full, with a
// unit free). A caller of several keys does not pass a heavy waiter
// (AcquireN), so it is refused there.
func TestQueueBoundBesideAHeavyWaiter(t *testing.T) {
	for i, bound := range []slots.Option{slots.WithMaxQueue(1), slots.WithMaxQueuePerFlow(1)} {
		t.Run(fmt.Sprintf("bound %d", i), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				reg := registry.New[string](4, bound)
				held, err := reg.TryAcquireN("k", 3)
				require.NoError(t, err)
				defer held.Release()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go reg.AcquireN(ctx, "k", 2) // waits: 1 unit free
				synctest.Wait()
				require.Equal(t, 1, reg.Waiting("k"))
				s, err := reg.Acquire(context.Background(), "k")
				require.NoError(t, err, "the free unit, beside a waiter it does not fit")
				assert.Equal(t, 4, reg.InFlight("k"))
				s.Release()
				assert.Zero(t, reg.Stats().QueueFull)
				_, err = reg.AcquireAll(context.Background(), "k", "other")
				assert.ErrorIs(t, err, slots.ErrQueueFull, "several keys: it does not pass the heavy waiter")
				assert.Equal(t, uint64(1), reg.Stats().QueueFull)
				cancel()
				synctest.Wait()
			})
		})
	}
}
