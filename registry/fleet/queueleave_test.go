package fleet

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// heldOnQ is a store whose call sent alone on key "q" waits for release
// and then fails; it notes the lease id of the first call on "p".
type heldOnQ struct {
	driver.Store
	release chan struct{}
	ticket  atomic.Pointer[string]
}

func (s *heldOnQ) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	switch c.Keys[0] {
	case "q":
		<-s.release
		return driver.AdmitResult{}, errors.New("the store went away")
	case "p":
		id := c.Lease
		s.ticket.CompareAndSwap(nil, &id)
	}
	return s.Store.AdmitOne(ctx, c)
}

// A queued waiter whose next call waits for a pipeline and is never sent,
// because the breaker opened meanwhile, leaves the fleet's queue before it
// is admitted under the local registry (FallbackLocal), as it does when the
// breaker is open before its call: it is held under a new id, and its
// ticket leaves the store's queue once the store answers, not when its
// liveness lapses.
func TestQueuedWaiterStoppedInThePipelineLeavesTheQueue(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		s := &heldOnQ{Store: ms, release: make(chan struct{})}
		r := New[string](s, 1, WithLogger(quiet()), WithTimeout(time.Minute))
		t.Cleanup(r.Close)
		r.calls.max = 1
		r2 := New[string](ms, 1, WithLogger(quiet()))
		t.Cleanup(r2.Close)
		other, err := r2.TryAcquire("p")
		require.NoError(t, err)

		type result struct {
			degraded bool
			err      error
		}
		done := make(chan result, 1)
		go func() {
			sl, err := r.Acquire(context.Background(), "p")
			if err != nil {
				done <- result{err: err}
				return
			}
			done <- result{degraded: sl.Degraded()}
			// Held until the test ends (Close releases it).
		}()
		synctest.Wait()
		require.Equal(t, 1, ms.Queued("p"), "the waiter queued in the store")

		go func() {
			if sl, err := r.TryAcquire("q"); err == nil {
				sl.Release()
			}
		}()
		synctest.Wait() // the call on "q" is on its way, alone
		for r.queued() == 0 {
			time.Sleep(10 * time.Millisecond) // virtual: until the waiter asks again
		}
		r.brk.isOpen.Store(true) // stands for failures of other calls meanwhile
		close(s.release)
		res := <-done
		require.NoError(t, res.err)
		assert.True(t, res.degraded, "admitted under the local registry")
		r.mu.Lock()
		for d := range r.held.degraded {
			assert.NotEqual(t, *s.ticket.Load(), d.id, "held under its ticket's id")
		}
		r.mu.Unlock()

		// The store answers again: the releaser sends what it kept.
		r.brk.success()
		r.recovered()
		synctest.Wait()
		assert.Zero(t, ms.Queued("p"), "the ticket left the store's queue")
		other.Release()
	})
}
