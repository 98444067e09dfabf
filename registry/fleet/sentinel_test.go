package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// Through Sentinel, with a failover: the master dies while a slot is held;
// the Sentinel promotes the replica; admission resumes on the new master,
// the held lease is there (replicated, or put back by the heartbeat), and
// it counts toward the cap.
func TestSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	ctx := context.Background()
	const ttl = 900 * time.Millisecond // renewals every 300 ms
	r := New[string](redisstore.New(st.Client(), "t"), 2, WithLeaseTTL(ttl), WithBreaker(3, 50*time.Millisecond))
	defer r.Close()

	held, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.False(t, held.Degraded())
	before, err := st.MasterAddr()
	require.NoError(t, err)
	require.Equal(t, st.Master.Addr, before)

	failOver(t, st, r)
	var s *slots.Slot
	require.Eventually(t, func() bool {
		if s, err = r.TryAcquire("k"); err != nil {
			return false
		}
		if s.Degraded() { // admitted during the switch, under the local registry
			s.Release()
			return false
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "admission resumes on the new master")
	_, err = r.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the held lease counts toward the cap of 2")

	held.Release()
	s.Release()
	require.Eventually(t, func() bool {
		n, err := r.InFlight(ctx, "k")
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "both leases removed")
}

// A caller waiting in the fleet's queue when the master dies is admitted
// once the Sentinel has promoted the replica and a holder releases:
// whether or not its place reached the replica, its own calls queue it
// again on the new master, and the wake-up subscription follows the
// failover.
func TestSentinelFailoverWithAWaiter(t *testing.T) {
	st := redistest.StartSentinel(t)
	const ttl = 900 * time.Millisecond
	r := New[string](redisstore.New(st.Client(), "t"), 1, WithLeaseTTL(ttl), WithBreaker(3, 50*time.Millisecond))
	defer r.Close()
	held, err := r.TryAcquire("k")
	require.NoError(t, err)
	other := New[string](redisstore.New(st.Client(), "t"), 1, WithLeaseTTL(ttl), WithBreaker(3, 50*time.Millisecond),
		WithUnavailable(FailClosed)) // a waiter that never admits outside Redis
	defer other.Close()
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			s, err := other.Acquire(ctx, "k")
			if errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
				continue // during the switch: wait again
			}
			if err == nil {
				s.Release()
			}
			got <- err
			return
		}
	}()
	require.Eventually(t, func() bool { return other.Stats().Waiting == 1 }, 10*time.Second, time.Millisecond)

	failOver(t, st, r)
	held.Release()
	select {
	case err := <-got:
		require.NoError(t, err, "the waiter is admitted on the new master")
	case <-time.After(20 * time.Second): // a bound on a hang
		t.Fatal("the waiter was never admitted after the failover")
	}
}

// failOver kills st's master and waits for the Sentinel to promote the
// replica and for the one lease r holds on "k" to be on it.
func failOver(t *testing.T, st *redistest.Sentinel, r *Registry[string]) {
	t.Helper()
	st.Master.Kill()
	require.Eventually(t, func() bool {
		addr, err := st.MasterAddr()
		return err == nil && addr == st.Replica.Addr
	}, 20*time.Second, 20*time.Millisecond, "the Sentinel promotes the replica")
	require.Eventually(t, func() bool {
		n, err := r.InFlight(context.Background(), "k")
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the held lease is on the new master")
}
