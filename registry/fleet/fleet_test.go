package fleet

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// mini is a miniredis with its clock set (redistest.Mini), for fleets
// named "t".
type mini struct {
	*redistest.Mini
	t *testing.T
}

func newMini(t *testing.T) *mini { return &mini{redistest.StartMini(t), t} }

func (m *mini) advance(d time.Duration) { m.Advance(d) }

// pass moves the server's clock on by d in steps of a quarter of ttl,
// each heard by the store of the fleet "t" (an empty renewal of ttl), as
// live processes are heard: moved on at once, the clock would be a
// silence, which holds the leases (see driver.Store).
func (m *mini) pass(d, ttl time.Duration) {
	m.t.Helper()
	s := redisstore.New(m.client(), "t")
	for d > 0 {
		step := min(d, ttl/4)
		m.Advance(step)
		d -= step
		_, err := s.Renew(context.Background(), &driver.RenewCall{TTL: ttl})
		require.NoError(m.t, err)
	}
}

func (m *mini) client() *redis.Client { return m.Client() }

// leases returns the leases on key (none if it is gone).
func (m *mini) leases(key string) []string { return m.Leases("t", key) }

// registry returns a fleet Registry on m named "t", closed at cleanup.
func (m *mini) registry(limit int, opts ...Option) *Registry[string] {
	return m.keyed(limit, Keys[string]{}, opts...)
}

// keyed is registry with keys' names and limits from keys.
func (m *mini) keyed(limit int, keys Keys[string], opts ...Option) *Registry[string] {
	r := NewWithKeys(redisstore.New(m.client(), "t"), limit, keys, append([]Option{WithLeaseTTL(3 * time.Second)}, opts...)...)
	m.t.Cleanup(r.Close)
	return r
}

// eventually waits until cond holds (the releaser works in the
// background), failing after a generous bound.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, time.Millisecond, what)
}

func TestAllOrNothingAcrossKeys(t *testing.T) {
	m := newMini(t)
	r := m.registry(2)
	r.SetLimit("m", 1)

	s1, err := r.TryAcquireAll("p", "m")
	require.NoError(t, err)
	_, err = r.TryAcquireAll("p", "m")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, "m", le.Key)
	assert.Equal(t, 1, le.Limit)
	assert.Len(t, m.leases("p"), 1, "a rejection takes nothing on p")

	s2, err := r.TryAcquire("p") // p has room for a request without m
	require.NoError(t, err)
	_, err = r.TryAcquire("p")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	n, err := r.InFlight(context.Background(), "p")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	assert.Equal(t, 2, r.Local().InFlight("p"), "the local registry mirrors this process's holders")

	assert.True(t, s1.Release())
	assert.False(t, s1.Release(), "a second release does nothing")
	s2.Release()
	eventually(t, "the leases are removed", func() bool { return len(m.leases("p")) == 0 && len(m.leases("m")) == 0 })
	st := r.Stats()
	assert.Equal(t, uint64(1), st.DoubleReleases)
	assert.Zero(t, st.Held)
	assert.Zero(t, r.Local().Keys())
}

// Renewal extends only leases that still exist: a released lease is never
// put back.
func TestRenewNeverResurrects(t *testing.T) {
	m := newMini(t)
	r := m.registry(1)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	id := m.leases("k")[0]
	m.advance(2 * time.Second)
	r.renew()
	score, err := m.Srv.ZScore("inflight:{t}:k", id)
	require.NoError(t, err)
	assert.Equal(t, float64(m.Now.Add(3*time.Second).UnixMilli()), score, "renewed to now + TTL")

	s.Release()
	eventually(t, "removed", func() bool { return len(m.leases("k")) == 0 })
	r.renew()
	assert.Empty(t, m.leases("k"), "a renewal after the release puts nothing back")

	res, err := r.store.Renew(context.Background(), &driver.RenewCall{TTL: 3 * time.Second,
		Leases: []driver.Renewal{{Lease: id, Mode: driver.ModeReport, Keys: []string{"k"}, Limits: []int{1}}}})
	require.NoError(t, err)
	assert.Equal(t, []driver.Fate{driver.FateGone}, res.Leases)
	assert.Empty(t, m.leases("k"), "the store itself does not add a missing lease it is only to report")
}

// A lease released while a renewal that reasserts it is under way is
// removed after it.
func TestReleaseDuringReassert(t *testing.T) {
	m := newMini(t)
	r := m.registry(1)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	m.Srv.Del("inflight:{t}:k") // lost: the next renewal puts it back
	r.mu.Lock()
	var l *lease[string]
	for x := range r.held.leases {
		l = x
	}
	r.mu.Unlock()
	s.Release() // released before the renewal's bookkeeping ran
	r.storeMu.Lock()
	var requeue []*lease[string]
	require.True(t, r.renewBatch([]renewal[string]{{l: l, mode: driver.ModePutBack, limits: []int{1}}}, &requeue))
	r.storeMu.Unlock()
	require.Len(t, requeue, 1, "the released lease is removed again")
	r.queueRelease(requeue[0])
	eventually(t, "the reasserted lease is removed", func() bool { return len(m.leases("k")) == 0 })
}

func TestDoubleReleaseAndNoScript(t *testing.T) {
	m := newMini(t)
	r := m.registry(1)
	require.NoError(t, m.client().ScriptFlush(context.Background()).Err())
	s, err := r.TryAcquire("k")
	require.NoError(t, err, "NOSCRIPT after SCRIPT FLUSH falls back to sending the script")
	require.NoError(t, m.client().ScriptFlush(context.Background()).Err())
	_, err = r.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.True(t, s.Release())
	assert.False(t, s.Release())
	eventually(t, "removed", func() bool { return len(m.leases("k")) == 0 })
	s2, err := r.TryAcquire("k")
	require.NoError(t, err, "the double release took nothing extra")
	s2.Release()
}

// A holder that stops renewing (its process died) has its lease expire
// after the TTL, and the cap frees up.
func TestDeadHolderExpires(t *testing.T) {
	m := newMini(t)
	dead := New[string](redisstore.New(m.client(), "t"), 1, WithLeaseTTL(3*time.Second))
	_, err := dead.TryAcquire("k")
	require.NoError(t, err)
	dead.Close() // no more renewals; the slot is never released

	live := m.registry(1)
	_, err = live.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	m.pass(2900*time.Millisecond, 3*time.Second) // the live process is heard
	_, err = live.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "not before the TTL")
	m.pass(200*time.Millisecond, 3*time.Second)
	s, err := live.TryAcquire("k")
	require.NoError(t, err, "the dead holder's lease expired")
	s.Release()
}

// A lease missing from Redis (a restart without persistence) is put back by
// the next renewal, or only reported.
func TestLostLease(t *testing.T) {
	for _, tc := range []struct {
		policy Lost
		back   bool
	}{{ReassertLost, true}, {ReportLost, false}} {
		m := newMini(t)
		r := m.registry(1, WithLostLeases(tc.policy))
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		m.Srv.FlushAll()
		r.renew()
		assert.Equal(t, tc.back, len(m.leases("k")) == 1)
		st := r.Stats()
		assert.Equal(t, uint64(1), st.Lost)
		assert.Equal(t, tc.back, st.Reasserted == 1)
		s.Release()
		eventually(t, "removed", func() bool { return len(m.leases("k")) == 0 })
	}
}

// While Redis fails: the breaker opens after three failed calls, and each
// mode answers as documented; when Redis is back the probe closes the
// breaker and the degraded leases are put into Redis.
func TestUnavailable(t *testing.T) {
	t.Run("local", func(t *testing.T) {
		m := newMini(t)
		r := m.registry(2, WithBreaker(3, 5*time.Millisecond))
		m.Srv.SetError("LOADING down for the test")
		var held []*slots.Slot
		for range 2 {
			s, err := r.TryAcquire("k")
			require.NoError(t, err)
			assert.True(t, s.Degraded())
			assert.False(t, s.Bypassed())
			held = append(held, s)
		}
		_, err := r.TryAcquire("k")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "the local cap holds")
		assert.True(t, r.Stats().BreakerOpen)
		assert.Equal(t, uint64(2), r.Stats().Degraded)

		m.Srv.SetError("")
		eventually(t, "the breaker closes and the leases go into Redis", func() bool {
			return !r.Stats().BreakerOpen && len(m.leases("k")) == 2 && r.Stats().Reasserted == 2
		})
		_, err = r.TryAcquire("k")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "the fleet counts them")
		for _, s := range held {
			s.Release()
		}
		eventually(t, "removed", func() bool { return len(m.leases("k")) == 0 })
	})
	t.Run("closed", func(t *testing.T) {
		m := newMini(t)
		r := m.registry(2, WithUnavailable(FailClosed))
		m.Srv.SetError("LOADING down for the test")
		for range 100 {
			_, err := r.TryAcquire("k")
			assert.ErrorIs(t, err, ErrUnavailable)
		}
		assert.True(t, r.Stats().BreakerOpen)
		// Three admission calls failed, and the three abandons queued for
		// their lease ids (in the background) fail too; the other 97
		// admissions made no call.
		assert.LessOrEqual(t, r.Stats().StoreErrors, uint64(6), "no call while the breaker is open")
	})
	t.Run("open", func(t *testing.T) {
		m := newMini(t)
		r := m.registry(2, WithUnavailable(FailOpen))
		m.Srv.SetError("LOADING down for the test")
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		assert.True(t, s.Bypassed())
		assert.True(t, s.Degraded())
		assert.Zero(t, r.Local().InFlight("k"), "a bypass holds nothing")
		s.Release()
	})
}

// A waiter is woken by a release in another process (pub/sub), long before
// its next poll.
func TestAcquireWokenByRelease(t *testing.T) {
	m := newMini(t)
	a := m.registry(1)
	b := m.registry(1, WithPoll(time.Minute, time.Minute))
	<-b.subscribed
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		s, err := b.Acquire(context.Background(), "k")
		if err == nil {
			s.Release()
		}
		got <- err
	}()
	eventually(t, "b waits", func() bool { return b.Stats().Waiting == 1 })
	s.Release()
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the release did not wake the waiter")
	}
}

// Waiters of one process on a full key are admitted in arrival order, and a
// waiter on a full key does not hold back one on a free key.
func TestAcquireFIFOInProcess(t *testing.T) {
	m := newMini(t)
	r := m.registry(1, WithPoll(time.Millisecond, 5*time.Millisecond))
	first, err := r.TryAcquire("k")
	require.NoError(t, err)
	var mu sync.Mutex
	var order []int
	var held []*slots.Slot
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			s, err := r.Acquire(context.Background(), "k")
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			order = append(order, i)
			held = append(held, s)
			mu.Unlock()
		})
		eventually(t, "queued", func() bool { return r.Stats().Waiting == i+1 })
	}
	other, err := r.Acquire(context.Background(), "free")
	require.NoError(t, err, "a free key is not held back")
	other.Release()

	first.Release()
	for n := 1; n <= 3; n++ {
		eventually(t, "the next is admitted", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == n })
		mu.Lock()
		s := held[n-1]
		mu.Unlock()
		s.Release()
	}
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2}, order)
}

func TestAcquireContextAndClose(t *testing.T) {
	m := newMini(t)
	r := m.registry(1)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = r.Acquire(ctx, "k")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = r.AcquireAll(context.Background())
	assert.Error(t, err, "no keys")
	//nolint:staticcheck // a nil context is the point
	_, err = r.Acquire(nil, "k")
	assert.ErrorIs(t, err, slots.ErrNilContext)

	done := make(chan error, 1)
	go func() { _, err := r.Acquire(context.Background(), "k"); done <- err }()
	eventually(t, "waiting", func() bool { return r.Stats().Waiting == 1 })
	r.Close()
	assert.True(t, errors.Is(<-done, ErrClosed))
	s.Release() // after Close: released locally, the lease expires in Redis
	_, err = r.TryAcquire("k")
	assert.ErrorIs(t, err, ErrClosed)
}

func TestLimitFunc(t *testing.T) {
	m := newMini(t)
	r := m.keyed(5, Keys[string]{Limit: func(k string) int { return len(k) }})
	r.SetLimit("abc", 1)
	assert.Equal(t, 2, r.Limit("ab"))
	assert.Equal(t, 1, r.Limit("abc"), "SetLimit wins")
	a, err := r.TryAcquire("ab")
	require.NoError(t, err)
	b, err := r.TryAcquire("ab")
	require.NoError(t, err)
	_, err = r.TryAcquire("ab")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, 2, r.Local().Limit("ab"), "the local registry has the same limit, so FallbackLocal caps alike")
	a.Release()
	b.Release()
}

// A key that Keys.Limit closes (a negative limit counts as 0) admits
// nothing under the local registry either, while Redis is down.
func TestClosedKeyStaysClosedWhileDown(t *testing.T) {
	m := newMini(t)
	r := m.keyed(5, Keys[string]{Limit: func(k string) int {
		if k == "closed" {
			return -1
		}
		return 5
	}})
	assert.Equal(t, 0, r.Limit("closed"))
	m.Srv.SetError("LOADING down for the test")
	_, err := r.TryAcquire("closed")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "FallbackLocal caps alike")
	s, err := r.TryAcquire("open")
	require.NoError(t, err)
	assert.True(t, s.Degraded())
	s.Release()
}

// With CancelLost, the holder's context from WithCancelOnLost is cancelled
// with ErrLeaseLost when its lease goes missing; other holders' are not.
func TestCancelLost(t *testing.T) {
	m := newMini(t)
	r := m.registry(2, WithLostLeases(CancelLost))
	ctx, cancel := WithCancelOnLost(context.Background())
	defer cancel()
	s, err := r.Acquire(ctx, "k")
	require.NoError(t, err)
	other, err := r.TryAcquire("other")
	require.NoError(t, err)
	m.Srv.Del("inflight:{t}:k") // k's lease is lost; other's is not
	r.renew()
	select {
	case <-ctx.Done():
		assert.ErrorIs(t, context.Cause(ctx), ErrLeaseLost)
	default:
		t.Fatal("the holder's context was not cancelled")
	}
	assert.Equal(t, uint64(1), r.Stats().Lost)
	assert.Empty(t, m.leases("k"), "not put back")
	assert.Len(t, m.leases("other"), 1)
	s.Release()
	other.Release()
}

// A renewal that failed on the client's side may still run on the server
// later: the lease, released meanwhile, is abandoned with a tombstone, so
// the late renewal does not bring it back.
func TestLateRenewalDoesNotResurrect(t *testing.T) {
	m := newMini(t)
	r := m.registry(1)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	id := m.leases("k")[0]
	var l *lease[string]
	r.mu.Lock()
	for x := range r.held.leases {
		l = x
	}
	r.mu.Unlock()
	assert.Empty(t, r.afterFailedRenew([]renewal[string]{{l: l, mode: driver.ModeReassert}}, unknownUntil), "as if a reassert call timed out; still held")
	s.Release()
	eventually(t, "abandoned", func() bool { return len(m.leases("k")) == 0 && m.Srv.Exists("inflight:{t}:abandoned:"+id) })
	// The late renewal runs now.
	res, err := r.store.Renew(context.Background(), &driver.RenewCall{TTL: 3 * time.Second,
		Leases: []driver.Renewal{{Lease: id, Mode: driver.ModePutBack, Keys: []string{"k"}, Limits: []int{1}}}})
	require.NoError(t, err)
	assert.Equal(t, []driver.Fate{driver.FateGone}, res.Leases)
	assert.Empty(t, m.leases("k"), "not put back")
	s2, err := r.TryAcquire("k")
	require.NoError(t, err)
	s2.Release()
}
