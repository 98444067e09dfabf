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
// and then fails, and which is down from then on (Ping fails too, so that
// the breaker's probe cannot close it) until up; it notes the lease id of
// the first call on "p".
type heldOnQ struct {
	driver.Store
	release chan struct{}
	down    atomic.Bool
	ticket  atomic.Pointer[string]
}

var errStoreGone = errors.New("the store went away")

func (s *heldOnQ) Ping(ctx context.Context) error {
	if s.down.Load() {
		return errStoreGone
	}
	return s.Store.Ping(ctx)
}

func (s *heldOnQ) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	switch c.Keys[0] {
	case "q":
		<-s.release
		s.down.Store(true)
		return driver.AdmitResult{}, errStoreGone
	case "p":
		id := c.Lease
		s.ticket.CompareAndSwap(nil, &id)
	}
	return s.Store.AdmitOne(ctx, c)
}

// A queued waiter whose next call waits for a pipeline and is never sent,
// because the breaker opened meanwhile, leaves the fleet's queue before it
// is decided outside the store, as it does when the breaker is open before
// its call. Under FallbackLocal it is held under a new id, put back into
// the store once it answers; under FailOpen it bypasses. Either way its
// ticket leaves the store's queue once the store answers, not when its
// liveness lapses.
func TestQueuedWaiterStoppedInThePipelineLeavesTheQueue(t *testing.T) {
	for _, name := range []string{"local", "open"} {
		u, err := ParseUnavailable(name)
		require.NoError(t, err)
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) { stoppedInThePipeline(t, u) })
		})
	}
}

func stoppedInThePipeline(t *testing.T, u Unavailable) {
	ms := memstore.New()
	s := &heldOnQ{Store: ms, release: make(chan struct{})}
	// The call on "q" failing opens the breaker.
	r := New[string](s, 1, WithLogger(quiet()), WithTimeout(time.Minute), WithBreaker(1, 250*time.Millisecond), WithUnavailable(u))
	t.Cleanup(r.Close)
	r.calls.max = 1
	r2 := New[string](ms, 1, WithLogger(quiet()))
	t.Cleanup(r2.Close)
	other, err := r2.TryAcquire("p")
	require.NoError(t, err)

	type result struct {
		degraded, bypassed bool
		err                error
	}
	done := make(chan result, 1)
	go func() {
		sl, err := r.Acquire(context.Background(), "p")
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{degraded: sl.Degraded(), bypassed: sl.Bypassed()}
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
	close(s.release)
	res := <-done
	require.NoError(t, res.err)
	assert.True(t, res.degraded, "decided outside the store")
	assert.Equal(t, u == FailOpen, res.bypassed)
	r.mu.Lock()
	onP := 0
	for d := range r.held.degraded {
		if d.names[0] == "p" {
			onP++
			assert.NotEqual(t, *s.ticket.Load(), d.id, "held under its ticket's id")
		}
	}
	r.mu.Unlock()
	if u == FallbackLocal {
		assert.Equal(t, 1, onP, "one lease held on p")
	}

	// The store answers again: the releaser sends what it kept, and the
	// heartbeat puts the lease held back.
	s.down.Store(false)
	r.brk.success()
	r.recovered()
	synctest.Wait()
	assert.Zero(t, ms.Queued("p"), "the ticket left the store's queue")
	n, err := ms.Count(context.Background(), "p")
	require.NoError(t, err)
	assert.Equal(t, 1+onP, n, "the lease held put back, under its new id")
	other.Release()
}
