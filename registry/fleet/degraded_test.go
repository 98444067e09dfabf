package fleet

import (
	"context"
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

// reachable waits until c gets answers through a network that was cut: the
// connections the cut broke are dropped from its pool on the way.
func reachable(t *testing.T, c *redis.Client) {
	t.Helper()
	require.Eventually(t, func() bool { return c.Ping(context.Background()).Err() == nil },
		10*time.Second, time.Millisecond, "redis-server reachable through the proxy")
}

// A brief network cut makes one admission degraded (admitted under the
// local registry alone, while its call failed). Once the network is back,
// that holder counts against the cap before this process's next admission
// is decided: with a cap of 2, one more is admitted, not two, and Redis
// counts both holders. The breaker never opens here, and its probe is an
// hour away: no background call puts the degraded lease in first.
func TestDegradedLeaseCountsOnceRedisIsBack(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv)
	c := px.Client()
	r := New[string](redisstore.New(c, "d"), 2, WithBreaker(1000, time.Hour))
	defer r.Close()
	ctx := context.Background()

	px.Cut()
	first, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.True(t, first.Degraded(), "admitted under the local registry alone")
	px.Heal()
	reachable(t, c)

	second, err := r.TryAcquire("k")
	require.NoError(t, err)
	assert.False(t, second.Degraded())
	third, err := r.TryAcquire("k")
	if !assert.ErrorIs(t, err, slots.ErrLimitReached, "the degraded holder counts: the cap of 2 is full") {
		third.Release()
	}
	assert.Equal(t, 2, r.Local().InFlight("k"), "this process holds 2")
	r.renew() // as the heartbeat does
	n, err := r.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "Redis counts 2 for the cap of 2")

	first.Release()
	second.Release()
	require.Eventually(t, func() bool {
		n, err := r.InFlight(ctx, "k")
		return err == nil && n == 0
	}, 10*time.Second, time.Millisecond, "both leases removed")
}

// The same cut seen from the rest of the fleet: the degraded lease goes
// into Redis within the probe interval once Redis answers, with no
// admission in this process to carry it and with the breaker closed all
// along, so that another process's admissions count it.
func TestDegradedLeaseGoesInWithoutAnAdmission(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv)
	c := px.Client()
	a := New[string](redisstore.New(c, "d"), 2, WithBreaker(1000, 20*time.Millisecond))
	defer a.Close()
	b := New[string](redisstore.New(srv.Client(), "d"), 2) // another process, its own path to Redis
	defer b.Close()
	ctx := context.Background()

	px.Cut()
	held, err := a.TryAcquire("k")
	require.NoError(t, err)
	require.True(t, held.Degraded())
	px.Heal()
	// Well within the renewal interval (a third of 30 s): put in by the
	// probe tick, not by a renewal.
	require.Eventually(t, func() bool {
		n, err := b.InFlight(ctx, "k")
		return err == nil && n == 1
	}, 5*time.Second, time.Millisecond, "the degraded lease is put into Redis")
	s, err := b.TryAcquire("k")
	require.NoError(t, err)
	_, err = b.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the other process counts the degraded holder")
	s.Release()
	held.Release()
}

// holdCall is a client hook that holds the next script call until released.
type holdCall struct {
	armed atomic.Bool
	open  chan struct{}
}

func (h *holdCall) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *holdCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "evalsha" && h.armed.CompareAndSwap(true, false) {
			<-h.open
		}
		return next(ctx, cmd)
	}
}

// An admission call under way when the breaker opened, which succeeds once
// Redis is back, closes the breaker: the degraded leases taken meanwhile
// still go into Redis at once (not at the next renewal).
func TestBreakerClosedByAnAdmission(t *testing.T) {
	m := newMini(t)
	h := &holdCall{open: make(chan struct{})}
	c := m.client()
	c.AddHook(h)
	r := New[string](redisstore.New(c, "t"), 10, WithLeaseTTL(30*time.Second), WithBreaker(3, time.Hour), WithTimeout(5*time.Second))
	defer r.Close()
	h.armed.Store(true)
	inflight := make(chan *slots.Slot, 1)
	go func() {
		s, err := r.TryAcquire("other")
		assert.NoError(t, err)
		inflight <- s
	}()
	eventually(t, "the call is held", func() bool { return !h.armed.Load() })
	m.Srv.SetError("LOADING down")
	var held []*slots.Slot
	for range 3 {
		s, err := r.TryAcquire("k2")
		require.NoError(t, err)
		require.True(t, s.Degraded())
		held = append(held, s)
	}
	require.True(t, r.Stats().BreakerOpen)
	m.Srv.SetError("")
	close(h.open) // the call under way reaches Redis, now back; the probe is hours away
	(<-inflight).Release()
	eventually(t, "the degraded leases go into Redis", func() bool { return len(m.leases("k2")) == 3 })
	for _, s := range held {
		s.Release()
	}
	eventually(t, "and are removed on release", func() bool { return len(m.leases("k2")) == 0 })
}

// A lease released while Redis fails (its removal fails) is not renewed,
// and its removal is sent again once Redis is back: the capacity frees at
// once, not when the lease expires (the server's clock stands still here).
func TestReleaseWhileDownRemovedWhenBack(t *testing.T) {
	m := newMini(t)
	r := m.registry(1, WithLeaseTTL(time.Minute), WithBreaker(1, 5*time.Millisecond))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	m.Srv.SetError("LOADING down")
	s.Release()
	eventually(t, "the removal failed, and waits", func() bool {
		st := r.Stats()
		return st.StoreErrors >= 1 && st.RemovalsPending == 1
	})
	require.Len(t, m.leases("k"), 1)
	m.Srv.SetError("")
	eventually(t, "the removal is sent again", func() bool { return len(m.leases("k")) == 0 })
	s2, err := r.TryAcquire("k")
	require.NoError(t, err, "the fleet has room again")
	s2.Release()
	assert.Zero(t, r.Stats().RemovalsDropped)
}
