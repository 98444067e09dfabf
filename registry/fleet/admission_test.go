package fleet

import (
	"context"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// One rule for keys, whether Redis decides or the local registry alone
// does: a key over the bound fails with registry.ErrInvalidKey, alone or
// among others, and nothing goes to Redis; a key at the bound is admitted.
func TestKeyRuleOnBothPaths(t *testing.T) {
	over := strings.Repeat("k", registry.DefaultMaxKeyBytes+1)
	at := over[1:]
	for _, down := range []bool{false, true} {
		m := newMini(t)
		r := m.registry(1, WithBreaker(1, time.Hour))
		if down {
			m.Srv.SetError("LOADING down")
		}
		_, err := r.TryAcquire(over)
		assert.ErrorIs(t, err, registry.ErrInvalidKey, "redis down: %v", down)
		_, err = r.TryAcquireAll("fine", over)
		assert.ErrorIs(t, err, registry.ErrInvalidKey, "redis down: %v", down)
		assert.Zero(t, r.Local().InFlight(over))
		assert.Equal(t, uint64(2), r.Stats().Rejected)
		m.Srv.SetError("")
		for _, k := range m.Srv.Keys() {
			assert.False(t, strings.Contains(k, over) || strings.Contains(k, "fine"),
				"nothing about the keys goes to Redis (redis down: %v)", down)
		}
		if down {
			m.Srv.SetError("LOADING down")
		}
		s, err := r.TryAcquire(at)
		require.NoError(t, err, "redis down: %v", down)
		assert.Equal(t, down, s.Degraded())
		assert.Equal(t, 1, r.Local().InFlight(at), "mirrored locally")
		s.Release()
		m.Srv.SetError("")
	}
}

// The local registry's key bound (registry.WithMaxKeyBytes) is the bound
// on both paths: the store's and the local registry's alone.
func TestMaxKeyBytes(t *testing.T) {
	for _, down := range []bool{false, true} {
		m := newMini(t)
		r := m.registry(1, WithLocalOptions(registry.WithMaxKeyBytes(8)), WithBreaker(1, time.Hour))
		if down {
			m.Srv.SetError("LOADING down")
		}
		_, err := r.TryAcquire("123456789")
		assert.ErrorIs(t, err, registry.ErrInvalidKey, "redis down: %v", down)
		s, err := r.TryAcquire("12345678")
		require.NoError(t, err, "redis down: %v", down)
		s.Release()
		m.Srv.SetError("")
	}
}

// InFlight refuses a key that admission refuses, and asks Redis nothing.
func TestInFlightRefusesInvalidKey(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicOnce{Store: redisstore.New(c, "t"), op: "count"}
	r := New[string](h, 1, WithLocalOptions(registry.WithMaxKeyBytes(8)))
	defer r.Close()
	n := h.calls.Load()
	_, err := r.InFlight(context.Background(), "123456789")
	assert.ErrorIs(t, err, registry.ErrInvalidKey)
	assert.Equal(t, n, h.calls.Load(), "nothing asked of the store")
	got, err := r.InFlight(context.Background(), "12345678")
	require.NoError(t, err)
	assert.Zero(t, got)
}

// A key unequal to itself (a NaN) can never be found again in the local
// registry: it is refused on both paths too.
func TestNaNKeyRefused(t *testing.T) {
	for _, down := range []bool{false, true} {
		m := newMini(t)
		r := New[float64](redisstore.New(m.client(), "f"), 1, WithLeaseTTL(3*time.Second), WithBreaker(1, time.Hour))
		defer r.Close()
		if down {
			m.Srv.SetError("LOADING down")
		}
		_, err := r.TryAcquireAll(1, math.NaN())
		assert.ErrorIs(t, err, registry.ErrInvalidKey, "redis down: %v", down)
		s, err := r.TryAcquire(1.5)
		require.NoError(t, err, "redis down: %v", down)
		s.Release()
		m.Srv.SetError("")
	}
}

// cancelAfter is a client hook that, armed, lets the next acquire call run
// on the server and, once one has succeeded, cancels the caller's context
// before handing back the reply: the context ends while the admission is
// being decided.
type cancelAfter struct {
	cancel atomic.Pointer[context.CancelFunc]
}

func (h *cancelAfter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *cancelAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && isAcquire(cmd) {
			if c := h.cancel.Swap(nil); c != nil {
				(*c)()
			}
		}
		return err
	}
}
func (h *cancelAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil && isAcquire(cmds[0]) {
			if c := h.cancel.Swap(nil); c != nil {
				(*c)()
			}
		}
		return err
	}
}

// A caller whose context ends while its acquire call is on its way is not
// admitted, even though Redis admitted its lease: the lease is given back
// (the cap of 1 has room again), the local mirror holds nothing, and the
// caller gets the context's error. Sent alone, and in a pipeline.
func TestContextEndedDuringCallIsNotAdmitted(t *testing.T) {
	t.Run("a call sent alone", func(t *testing.T) {
		m := newMini(t)
		c := m.client()
		h := &cancelAfter{}
		c.AddHook(h)
		r := New[string](redisstore.New(c, "t"), 1, WithLeaseTTL(time.Minute))
		defer r.Close()
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel.Store(&cancel)
		s, err := r.Acquire(ctx, "k")
		require.ErrorIs(t, err, context.Canceled)
		assert.Nil(t, s)
		assertGivenBack(t, m, r)
	})
	t.Run("a call in a pipeline", func(t *testing.T) {
		m := newMini(t)
		h := &cancelAfter{}
		r, hold := pipelinedWith(t, m, 2, []redis.Hook{h}, WithLeaseTTL(time.Minute))
		first := holdAlone(t, r, hold, "other")
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel.Store(&cancel)
		got := make(chan error, 1)
		go func() {
			s, err := r.Acquire(ctx, "k")
			if err == nil {
				s.Release()
			}
			got <- err
		}()
		eventually(t, "queued", func() bool { return r.queued() == 1 })
		close(hold.openAlone)
		require.NotNil(t, <-first)
		require.ErrorIs(t, <-got, context.Canceled)
		assertGivenBack(t, m, r)
	})
}

// assertGivenBack checks that r admitted nothing on "k": nothing is held,
// locally or in Redis, and the cap has room.
func assertGivenBack(t *testing.T, m *mini, r *Registry[string]) {
	t.Helper()
	assert.Zero(t, r.Local().InFlight("k"), "nothing in the local mirror")
	eventually(t, "the lease Redis admitted is given back", func() bool { return len(m.leases("k")) == 0 })
	s, err := r.TryAcquire("k")
	require.NoError(t, err, "the cap has room")
	s.Release()
	eventually(t, "released", func() bool { return len(m.leases("k")) == 0 })
	assert.Equal(t, 0, r.Local().InFlight("k"))
}

// A refusal names the key that was full, by its name in Redis, whether
// Redis decided or, while it is unreachable, the local registry alone.
func TestLimitErrorNamesTheFullKey(t *testing.T) {
	for _, down := range []bool{false, true} {
		m := newMini(t)
		r := m.keyed(5, Keys[string]{Name: func(k string) string { return "name-" + k }}, WithBreaker(1, time.Hour))
		r.SetLimit("b", 1)
		s, err := r.TryAcquire("b")
		require.NoError(t, err)
		if down {
			m.Srv.SetError("LOADING down")
		}
		_, err = r.TryAcquireAll("a", "b", "c")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le, "redis down: %v", down)
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		assert.Equal(t, "name-b", le.Key, "redis down: %v", down)
		assert.Equal(t, 1, le.Limit)
		assert.Equal(t, 1, le.InFlight)
		m.Srv.SetError("")
		s.Release()
	}
}

// A caller whose context ends before its call is sent sends nothing: no
// lease id is abandoned, so no tombstone is written for it. The context
// ends here while the call is being made ready (in the LimitFunc).
func TestContextEndedBeforeSendingSendsNothing(t *testing.T) {
	m := newMini(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := m.keyed(1, Keys[string]{Limit: func(string) int { cancel(); return 1 }})
	_, err := r.Acquire(ctx, "k")
	require.ErrorIs(t, err, context.Canceled)
	closeWithin(t, r) // sends what the releaser has queued
	assert.Zero(t, tombstones(m), "no abandon")
	assert.Empty(t, m.leases("k"))
}

// slots.Unlimited (math.MaxInt) is a valid limit for the script, keys with
// braces or empty keys work, and limit 0 rejects.
func TestUnlimitedZeroAndOddKeys(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "u"), slots.Unlimited)
	defer r.Close()
	r.SetLimit("zero", 0)
	var held []*slots.Slot
	for range 50 {
		s, err := r.TryAcquireAll("a", "b{x}", "")
		require.NoError(t, err)
		assert.False(t, s.Degraded())
		held = append(held, s)
	}
	_, err := r.TryAcquire("zero")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	for _, s := range held {
		s.Release()
	}
	require.Eventually(t, func() bool { n, _ := r.InFlight(context.Background(), "a"); return n == 0 }, 5*time.Second, time.Millisecond)
	assert.Zero(t, r.Stats().StoreErrors)
	assert.Panics(t, func() { New[string](redisstore.New(srv.Client(), "a{b"), 1) })
	assert.Panics(t, func() { New[string](redisstore.New(nil, "a"), 1) })
}
