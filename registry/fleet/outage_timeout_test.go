package fleet

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// slowKey makes the admission calls on key k hang until their deadline
// (a store slow on one key: its row locked, say) while hang is set; the
// other calls are answered.
type slowKey struct {
	*memstore.Store
	hang atomic.Bool
	k    string
}

func (s *slowKey) slow(calls ...*driver.AdmitCall) bool {
	if !s.hang.Load() {
		return false
	}
	for _, c := range calls {
		if slices.Contains(c.Keys, s.k) {
			return true
		}
	}
	return false
}

func (s *slowKey) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if s.slow(c) {
		<-ctx.Done()
		return driver.AdmitResult{Err: ctx.Err()}, ctx.Err()
	}
	return s.Store.AdmitOne(ctx, c)
}

func (s *slowKey) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	if s.slow(calls...) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Admit(ctx, calls)
}

// A waiter whose call times out with the breaker closed (o.retry) gives
// its place in the fleet's queue back (it asks again under a new id), and
// a call that times out is made again, never decided under the local
// registry: so a newcomer does not leave it the room meanwhile. While the
// store is slow on the key (its calls there time out, its other calls
// answered, so the breaker stays closed), newcomers whose calls time out
// are admitted under the local registry, as WithUnavailable(FallbackLocal)
// says of a call that fails. (Left to such a waiter, they were all
// refused, the waiter was never admitted, and the key's room stood idle
// here though the fleet had room on it.)
func TestRoomNotIdleWhileAQueuedWaiterTimesOut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		st := &slowKey{Store: memstore.New(), k: "k"}
		r := New[string](st, 1, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Second, 4*time.Second))
		defer r.Close()
		other := New[string](st.Store, 1, WithLogger(quiet())) // another process, which holds the key's unit
		defer other.Close()
		held, err := other.TryAcquire("k")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(ctx, "k") })
		synctest.Wait()
		require.Equal(t, 1, st.Queued("k"), "the waiter is queued in the fleet's queue")
		st.hang.Store(true)
		held.Release() // the fleet has room on k now
		synctest.Wait()
		start := time.Now()
		admitted, refused := 0, 0
		var w *slots.Slot
		for range 12 {
			x, err := r.TryAcquire("x") // the store answers: the breaker stays closed
			require.NoError(t, err)
			x.Release()
			s, err := r.TryAcquire("k") // its call times out: decided under the local registry
			require.False(t, r.Stats().BreakerOpen)
			if err == nil {
				admitted++
				s.Release()
			} else {
				refused++
			}
			synctest.Wait()
			select {
			case w = <-got:
			default:
			}
			if w != nil {
				break
			}
			time.Sleep(5 * time.Second)
		}
		if w != nil {
			w.Release()
		}
		assert.True(t, admitted > 0 || w != nil,
			"for %v nobody was admitted on k (%d newcomers refused for a waiter whose calls time out)", time.Since(start), refused)
		st.hang.Store(false)
		cancel()
		<-got
	})
}

// hangX holds the admission calls on "x" until release is closed, their
// deadline ignored, while hang is set: with one call on its way at a time
// (calls.max), the calls queued behind it are dropped, never sent
// (errQueueTimeout).
type hangX struct {
	*memstore.Store
	hang    atomic.Bool
	release chan struct{}
}

func (s *hangX) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if s.hang.Load() && slices.Contains(c.Keys, "x") {
		<-s.release
	}
	return s.Store.AdmitOne(ctx, c)
}

// A waiter's call dropped before it was sent (errQueueTimeout: the one
// call on its way at a time, calls.max, hangs) times out, the breaker
// closed, but gives nothing back: the waiter keeps its place in the
// fleet's queue under the same id, and a newcomer whose own call fails
// the same way leaves it the room, as the store would. (Only a call sent
// gives the place back; see TestRoomNotIdleWhileAQueuedWaiterTimesOut.)
func TestAWaiterWhoseCallWasNotSentKeepsItsPlaceBeforeNewcomers(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		st := &hangX{Store: memstore.New(), release: make(chan struct{})}
		r := New[string](st, 1, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Hour, time.Hour))
		defer r.Close()
		r.calls.max = 1
		other := New[string](st.Store, 1, WithLogger(quiet())) // another process, which holds the key's unit
		defer other.Close()
		held, err := other.TryAcquire("k")
		require.NoError(t, err)
		defer held.Release()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := acquireIn(func() (*slots.Slot, error) { return r.Acquire(ctx, "k") })
		synctest.Wait()
		require.Equal(t, 1, st.Queued("k"), "the waiter is queued in the fleet's queue")
		st.hang.Store(true)
		x := acquireIn(func() (*slots.Slot, error) { return r.TryAcquire("x") }) // the one call on its way
		synctest.Wait()
		time.Sleep(3 * time.Second) // the waiter asks again within a claim window: its call is dropped
		synctest.Wait()
		require.Equal(t, 1, st.Queued("k"), "the waiter keeps its place in the fleet's queue")
		s, err := r.TryAcquire("k") // its call is dropped too
		require.False(t, r.Stats().BreakerOpen)
		if err == nil {
			t.Errorf("a newcomer whose call failed was admitted (Degraded %v) ahead of the waiter holding its place in the fleet's queue", s.Degraded())
			s.Release()
		}
		close(st.release)
		if s := <-x; s != nil {
			s.Release()
		}
		cancel()
		<-got
	})
}
