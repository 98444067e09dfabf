package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
)

// panicOnce is a store whose op ("renew", "release", "ping" or "count")
// panics once
// armed, as a faulty store (or a hook in its client: tracing, metrics)
// would; calls counts the calls of op.
type panicOnce struct {
	driver.Store
	op           string
	armed, fired atomic.Bool
	calls        atomic.Int64
}

func (h *panicOnce) hit(op string) {
	if op != h.op {
		return
	}
	h.calls.Add(1)
	if h.armed.CompareAndSwap(true, false) {
		h.fired.Store(true)
		panic("store panics")
	}
}

func (h *panicOnce) Renew(ctx context.Context, c *driver.RenewCall) (driver.RenewResult, error) {
	h.hit("renew")
	return h.Store.Renew(ctx, c)
}

func (h *panicOnce) Count(ctx context.Context, key string) (int, error) {
	h.hit("count")
	return h.Store.Count(ctx, key)
}

func (h *panicOnce) Ping(ctx context.Context) error {
	h.hit("ping")
	return h.Store.Ping(ctx)
}

func (h *panicOnce) Release(ctx context.Context, c *driver.ReleaseCall) error {
	h.hit("release")
	return h.Store.Release(ctx, c)
}

// quiet is a logger for tests that make the Registry log on purpose.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// closeWithin closes r, failing the test if Close has not returned within
// a generous bound.
func closeWithin(t *testing.T, r *Registry[string]) {
	t.Helper()
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second): // a bound on a hang
		t.Fatal("Close hangs")
	}
}

// A renewal that panics (a client hook) leaves nothing locked and stops
// nothing: the heartbeat goes on renewing, a release is removed from Redis,
// and Close returns. The server's clock stands still, so the lease would
// stay in Redis for good if its removal never went.
func TestRenewalPanicKeepsTheHeartbeat(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicOnce{Store: redisstore.New(c, "t"), op: "renew"}
	r := New[string](h, 1, WithLeaseTTL(90*time.Millisecond), WithLogger(quiet()))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	other, err := r.TryAcquire("other")
	require.NoError(t, err)
	h.armed.Store(true)
	eventually(t, "a renewal panics", h.fired.Load)
	s.Release()
	eventually(t, "the lease is removed from Redis", func() bool { return len(m.leases("k")) == 0 })
	n := h.calls.Load()
	eventually(t, "the heartbeat renews again", func() bool { return h.calls.Load() > n })
	other.Release()
	closeWithin(t, r)
}

// A probe that panics (a client hook, on PING) does not end the probing:
// once Redis answers, the breaker closes and admissions go to Redis again.
func TestProbePanicKeepsProbing(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicOnce{Store: redisstore.New(c, "t"), op: "ping"}
	r := New[string](h, 2, WithBreaker(1, 10*time.Millisecond), WithLogger(quiet()))
	defer closeWithin(t, r)
	m.Srv.SetError("LOADING down")
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.True(t, s.Degraded())
	require.True(t, r.Stats().BreakerOpen)
	h.armed.Store(true)
	eventually(t, "a probe panics", h.fired.Load)
	m.Srv.SetError("")
	eventually(t, "the breaker closes", func() bool { return !r.Stats().BreakerOpen })
	s2, err := r.TryAcquire("k")
	require.NoError(t, err)
	assert.False(t, s2.Degraded(), "admitted by Redis")
	s.Release()
	s2.Release()
}

// A removal that panics (a client hook) does not crash the process: it
// counts as a failed call, and the removal is sent again.
func TestRemovalPanicIsSentAgain(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicOnce{Store: redisstore.New(c, "t"), op: "release"}
	r := New[string](h, 1, WithLeaseTTL(time.Minute), WithLogger(quiet()))
	defer closeWithin(t, r)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	h.armed.Store(true)
	s.Release()
	eventually(t, "the removal panics", h.fired.Load)
	eventually(t, "and is sent again", func() bool { return len(m.leases("k")) == 0 })
	assert.Equal(t, uint64(1), r.Stats().StoreErrors, "counted as a failed call")
	assert.Zero(t, r.Stats().RemovalsDropped)
}

// A renewal of many leases goes in several calls; once one has failed and
// the breaker is open, the rest are not sent: each would wait for its own
// call timeout, holding up the removals (storeMu) all along.
func TestRenewalStopsOnceTheBreakerOpens(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicOnce{Store: redisstore.New(c, "t"), op: "renew"}
	r := New[string](h, 1, WithLeaseTTL(time.Minute), WithBreaker(1, time.Hour))
	defer closeWithin(t, r)
	for i := range 3 * batchSize {
		s, err := r.TryAcquire(fmt.Sprint("k", i))
		require.NoError(t, err)
		defer s.Release()
	}
	m.Srv.SetError("LOADING down")
	n := h.calls.Load()
	assert.False(t, r.renew())
	assert.True(t, r.Stats().BreakerOpen)
	assert.Equal(t, int64(1), h.calls.Load()-n, "renewal calls sent")
	m.Srv.SetError("")
}

// A removal that fails and opens the breaker, with a log handler that
// panics on the breaker's warning: the batch the releaser took off its
// queue is still sent again, so the released lease leaves Redis.
func TestRemovalSurvivesALogHandlerThatPanics(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicOnce{Store: redisstore.New(c, "t"), op: "release"}
	var logged atomic.Bool
	r := New[string](h, 1, WithLeaseTTL(time.Minute), WithBreaker(1, 10*time.Millisecond),
		WithLogger(slog.New(testrig.PanicHandler{Match: "breaker open", Fired: &logged})))
	defer closeWithin(t, r)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	h.armed.Store(true)
	s.Release()
	eventually(t, "the removal fails", h.fired.Load)
	eventually(t, "the breaker-open warning panics", logged.Load)
	eventually(t, "the released lease leaves Redis", func() bool { return len(m.leases("k")) == 0 })
	assert.Zero(t, r.Stats().RemovalsDropped)
}

// A renewal that fails, with the breaker closed, is made again at the
// probe interval, not a renewal round later: after Redis lost its data,
// the held leases must go back within the round that new admissions wait
// for. The renewal round here is 20 s; the lease, gone from Redis while
// the renewal failed, is back at the probe interval.
func TestFailedRenewalIsMadeAgainSoon(t *testing.T) {
	m := newMini(t)
	r := m.registry(1, WithLeaseTTL(time.Minute), WithBreaker(1000, 5*time.Millisecond), WithLogger(quiet()))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	defer s.Release()
	m.Srv.SetError("LOADING down")
	r.lostData() // the heartbeat renews at once, and fails
	eventually(t, "a renewal fails", func() bool { return r.Stats().StoreErrors > 0 })
	m.Srv.Del("inflight:{t}:k")
	m.Srv.SetError("")
	eventually(t, "the lease is back", func() bool { return len(m.leases("k")) == 1 })
	assert.False(t, r.Stats().BreakerOpen)
}

// A renewal that keeps failing is made again at the next probe tick, then
// after 2, 4, 8, ... ticks, up to a renewal round; one that works ends it.
// (Retried at every tick, renewals that fail in part, with the breaker
// closed by the calls that work, multiplied the load on a struggling Redis
// by up to a round's ticks.)
func TestRetryTicksBackOff(t *testing.T) {
	rt := retryTicks{max: 10}
	assert.False(t, rt.due(), "nothing failed")
	var gaps []int
	ticks := 0
	rt.after(false)
	for len(gaps) < 6 {
		ticks++
		if rt.due() {
			gaps = append(gaps, ticks)
			ticks = 0
			rt.after(false)
		}
	}
	assert.Equal(t, []int{1, 2, 4, 8, 10, 10}, gaps)
	rt.after(true)
	for range 20 {
		assert.False(t, rt.due(), "a renewal that worked ends the retries")
	}
	rt.after(false)
	assert.True(t, rt.due(), "a new failure: the next tick")
}

// Within a TTL of a data loss a failed renewal is made again at every
// tick: the held leases must be back before the pause ends.
func TestRetryTicksSoon(t *testing.T) {
	rt := retryTicks{max: 10}
	for range 4 {
		rt.after(false) // backed off to 8 ticks
	}
	rt.soon()
	assert.True(t, rt.due(), "the next tick")
}
