package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// A release whose removal fails during a network cut is sent again once the
// network is back: the capacity frees at once for the rest of the fleet,
// not when the lease expires (a minute here).
func TestReleaseDuringCutIsSentAgain(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv)
	r := New[string](redisstore.New(px.Client(), "c"), 1, WithLeaseTTL(time.Minute), WithBreaker(3, 20*time.Millisecond))
	defer r.Close()
	other := New[string](redisstore.New(srv.Client(), "c"), 1, WithLeaseTTL(time.Minute)) // another process, its own path to Redis
	defer other.Close()
	ctx := context.Background()
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.False(t, s.Degraded())

	px.Cut()
	s.Release()
	require.Eventually(t, func() bool { return r.Stats().StoreErrors >= 1 }, 10*time.Second, time.Millisecond,
		"the removal fails")
	n, err := other.InFlight(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 1, n, "the lease is still in Redis")
	px.Heal()
	require.Eventually(t, func() bool {
		n, err := other.InFlight(ctx, "k")
		return err == nil && n == 0
	}, 10*time.Second, time.Millisecond, "the removal is sent again once the network is back")
	s2, err := other.TryAcquire("k")
	require.NoError(t, err, "the fleet has room")
	s2.Release()
	assert.Zero(t, r.Stats().RemovalsDropped)
}

// Release never waits for Redis. With redis-server stopped (SIGSTOP) and
// calls that time out after a minute (the client's own timeouts longer
// still), the releaser's first removal hangs for the whole test; 6,000
// releases at once must all return while the server is still stopped,
// their removals queued. Once it resumes, every lease is removed.
func TestReleaseDoesNotWaitForRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 2 * time.Minute, WriteTimeout: 2 * time.Minute,
		ContextTimeoutEnabled: true, PoolSize: 64, Protocol: 2})
	t.Cleanup(func() { c.Close() })
	r := New[string](redisstore.New(c, "h"), 10000, WithLeaseTTL(3*time.Minute), WithTimeout(time.Minute))
	t.Cleanup(r.Close)
	stopped := false
	t.Cleanup(func() { // before Close, which sends what is queued
		if stopped {
			srv.Cont()
		}
	})
	ctx := context.Background()
	const n = 6000
	held := make([]*slots.Slot, n)
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				s, err := r.TryAcquire("k")
				if assert.NoError(t, err) {
					held[i] = s
				}
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())

	srv.Stop()
	stopped = true
	var longest atomic.Int64
	start := make(chan struct{})
	for _, s := range held {
		wg.Go(func() {
			<-start
			t0 := time.Now()
			s.Release()
			d := int64(time.Since(t0))
			for l := longest.Load(); d > l && !longest.CompareAndSwap(l, d); l = longest.Load() {
			}
		})
	}
	close(start)
	returned := make(chan struct{})
	go func() { wg.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(20 * time.Second): // a bound on a hang: the stopped server answers nothing for a minute
		t.Fatal("Release calls wait for the stopped redis-server")
	}
	st := r.Stats()
	assert.Positive(t, st.RemovalsPending, "the removals wait in the queue: Redis took none")
	t.Logf("6,000 releases while redis-server is stopped: longest Release %v; %d removals queued",
		time.Duration(longest.Load()), st.RemovalsPending)

	srv.Cont()
	stopped = false
	require.Eventually(t, func() bool {
		n, err := r.InFlight(ctx, "k")
		return err == nil && n == 0
	}, 2*time.Minute, 10*time.Millisecond, "every lease removed once the server resumes")
	assert.Zero(t, r.Stats().RemovalsDropped)
}

// Past the bound of pending removals the oldest are dropped, and counted:
// their leases expire in Redis after the TTL. Release still never waits.
func TestPendingRemovalsAreBounded(t *testing.T) {
	m := newMini(t)
	r := m.registry(100)
	r.remMu.Lock()
	r.maxPending = 10
	r.remMu.Unlock()
	var held []*slots.Slot
	for range 25 {
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		held = append(held, s)
	}
	r.storeMu.Lock() // a removal or renewal under way on a slow Redis
	held[0].Release()
	eventually(t, "the releaser took the first removal, and waits", func() bool { return r.Stats().RemovalsPending == 0 })
	for _, s := range held[1:] {
		s.Release()
	}
	st := r.Stats()
	assert.Equal(t, 10, st.RemovalsPending)
	assert.Equal(t, uint64(14), st.RemovalsDropped)
	r.storeMu.Unlock()
	eventually(t, "the first removal and the ten kept are sent", func() bool {
		return r.Stats().RemovalsPending == 0 && len(m.leases("k")) == 14
	})
	m.pass(3*time.Second, 3*time.Second) // the TTL, the store hearing the fleet: the dropped ones expire
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	s.Release()
	eventually(t, "expired", func() bool { return len(m.leases("k")) == 0 })
}
