package fleet

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// While the store cannot be reached (FallbackLocal), this process's
// waiters are woken by its releases (PROTOCOL.md, Waiting), and a newcomer
// never passes a waiter that could take the room (package doc). A lease
// admitted in the store before the outage and released during it woke no
// waiter: the waiter slept out its backoff, and a TryAcquire made
// meanwhile took the room ahead of it.
func TestOutageReleaseWakesLocalWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Second), WithPoll(5*time.Second, 5*time.Second))
		defer r.Close()
		held, err := r.TryAcquire("k") // in the store
		require.NoError(t, err)
		ms.Kill()
		got := make(chan *slots.Slot, 1)
		go func() {
			s, err := r.Acquire(context.Background(), "k")
			if err == nil {
				got <- s
			}
			close(got)
		}()
		synctest.Wait()
		require.True(t, r.Stats().BreakerOpen)
		require.Equal(t, 1, r.Stats().Waiting)
		held.Release()
		synctest.Wait()
		select {
		case s := <-got:
			require.NotNil(t, s)
			s.Release()
		default:
			s, err := r.TryAcquire("k")
			if err == nil {
				t.Errorf("a TryAcquire passed the waiter, which was not woken by the release")
				s.Release()
			} else {
				t.Errorf("the waiter was not woken by the release")
			}
			ms.Restart()
			s = <-got
			if s != nil {
				s.Release()
			}
		}
	})
}

// The same with a lease admitted during the outage (degraded), whose
// release wakes the waiter: a TryAcquire made right after the release,
// before the woken waiter runs, takes the room ahead of it.
func TestOutageNewcomerDoesNotPassWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Second), WithPoll(5*time.Second, 5*time.Second))
		defer r.Close()
		ms.Kill()
		held, err := r.TryAcquire("k") // the call fails: admitted outside the store
		require.NoError(t, err)
		require.True(t, r.Stats().BreakerOpen)
		got := make(chan *slots.Slot, 1)
		go func() {
			s, err := r.Acquire(context.Background(), "k")
			if err == nil {
				got <- s
			}
			close(got)
		}()
		synctest.Wait()
		require.Equal(t, 1, r.Stats().Waiting)
		held.Release()
		if s, err := r.TryAcquire("k"); err == nil {
			t.Errorf("a TryAcquire passed the waiter")
			s.Release()
		}
		ms.Restart()
		if s := <-got; s != nil {
			s.Release()
		}
	})
}
