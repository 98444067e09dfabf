package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/slots"
)

// lateCall is a client hook that makes the next acquire call fail on the
// client's side (as a timeout would) while the script still runs on the
// server: before the abandon that follows reaches Redis, or after it.
// lateRes is what the late call returned.
type lateCall struct {
	c          *redis.Client
	armed      atomic.Bool
	afterTomb  bool          // run the late script once its tombstone exists
	tombExists func() bool   // with afterTomb
	ran        chan struct{} // closed once the late script has run
	lateRes    []int64
}

func (h *lateCall) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !(cmd.Name() == "evalsha" || cmd.Name() == "eval") || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmd)
		}
		late := redis.NewCmd(context.Background(), cmd.Args()...)
		if !h.afterTomb {
			_ = next(context.Background(), late) // the server runs it now...
			h.lateRes, _ = late.Int64Slice()
			close(h.ran)
		} else {
			go func() {
				for deadline := time.Now().Add(3 * time.Second); !h.tombExists() && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond) // polling the server for the abandon
				}
				_ = h.c.Process(context.Background(), late) // ...or after the abandon
				h.lateRes, _ = late.Int64Slice()
				close(h.ran)
			}()
		}
		cmd.SetErr(context.DeadlineExceeded) // ...but the client gives up
		return context.DeadlineExceeded
	}
}

// An acquire call that fails on the client's side but runs on the server
// takes nothing: whether it runs before or after the abandon that follows,
// no lease is left behind, and a FallbackLocal admission made meanwhile is
// not in Redis either (its release leaves nothing).
func TestFailedCallTakesNothing(t *testing.T) {
	for _, afterTomb := range []bool{false, true} {
		for _, mode := range []Unavailable{FailClosed, FallbackLocal} {
			m := newMini(t)
			c := m.client()
			h := &lateCall{c: c, afterTomb: afterTomb, ran: make(chan struct{})}
			h.tombExists = func() bool {
				keys := m.srv.Keys()
				for _, k := range keys {
					if len(k) > len("inflight:{t}:abandoned:") && k[:len("inflight:{t}:abandoned:")] == "inflight:{t}:abandoned:" {
						return true
					}
				}
				return false
			}
			require.NoError(t, acquireScript.Load(context.Background(), c).Err()) // the late EVALSHA runs for real
			c.AddHook(h)
			r := New[string](c, "t", 1, WithLeaseTTL(3*time.Second), WithUnavailable(mode))
			h.armed.Store(true)
			s, err := r.TryAcquire("k")
			if mode == FailClosed {
				require.ErrorIs(t, err, ErrUnavailable)
			} else {
				require.NoError(t, err)
				assert.True(t, s.Degraded())
			}
			<-h.ran
			require.Len(t, h.lateRes, 6)
			if afterTomb {
				assert.Equal(t, int64(-1), h.lateRes[0], "the tombstone refuses the late call")
			} else {
				assert.Equal(t, int64(1), h.lateRes[0], "the late call took a lease, for the abandon to take back")
			}
			eventually(t, "whatever the late call added is removed", func() bool {
				return len(m.leases("k")) == 0 && r.Stats().RemovalsPending == 0
			})
			if s != nil {
				s.Release()
			}
			eventually(t, "the breaker closes", func() bool { return !r.Stats().BreakerOpen })
			s2, err := r.TryAcquire("k")
			require.NoError(t, err, "after tombstone %v, mode %v: the fleet has room", afterTomb, mode)
			s2.Release()
			r.Close()
		}
	}
}

// A waiter blocked on a full key holds back later waiters on that key only:
// a request whose keys are free is admitted at once, while two earlier ones
// wait for model:x.
func TestWaitersDoNotBlockOtherKeys(t *testing.T) {
	m := newMini(t)
	r := m.registry(100, WithPoll(5*time.Millisecond, 50*time.Millisecond))
	r.SetLimit("model:x", 1)
	hold, err := r.TryAcquire("model:x")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := r.AcquireAll(ctx, "provider", "model:x")
			errs <- err
		}()
		eventually(t, "queued", func() bool { return r.Stats().Waiting == i+1 })
	}
	eventually(t, "both wait on model:x alone", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, w := range r.allWaiters() {
			if len(w.blocked) != 1 || w.blocked[0] != "inflight:{t}:model:x" {
				return false
			}
		}
		return true
	})
	yctx, ycancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ycancel()
	s, err := r.AcquireAll(yctx, "provider", "model:y")
	require.NoError(t, err, "free keys are not held back")
	s.Release()
	cancel()
	<-errs
	<-errs
	hold.Release()
}

// With ReportLost a lost lease is counted and logged once, not at every
// renewal.
func TestReportLostCountedOnce(t *testing.T) {
	m := newMini(t)
	r := m.registry(1, WithLostLeases(ReportLost))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	m.srv.FlushAll()
	for range 3 {
		r.renew()
	}
	assert.Equal(t, uint64(1), r.Stats().Lost)
	s.Release()
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
	r := New[string](c, "t", 10, WithLeaseTTL(30*time.Second), WithBreaker(3, time.Hour), WithTimeout(5*time.Second))
	defer r.Close()
	h.armed.Store(true)
	inflight := make(chan *slots.Slot, 1)
	go func() {
		s, err := r.TryAcquire("other")
		assert.NoError(t, err)
		inflight <- s
	}()
	eventually(t, "the call is held", func() bool { return !h.armed.Load() })
	m.srv.SetError("LOADING down")
	var held []*slots.Slot
	for range 3 {
		s, err := r.TryAcquire("k2")
		require.NoError(t, err)
		require.True(t, s.Degraded())
		held = append(held, s)
	}
	require.True(t, r.Stats().BreakerOpen)
	m.srv.SetError("")
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
	m.srv.SetError("LOADING down")
	s.Release()
	eventually(t, "the removal failed, and waits", func() bool {
		st := r.Stats()
		return st.RedisErrors >= 1 && st.RemovalsPending == 1
	})
	require.Len(t, m.leases("k"), 1)
	m.srv.SetError("")
	eventually(t, "the removal is sent again", func() bool { return len(m.leases("k")) == 0 })
	s2, err := r.TryAcquire("k")
	require.NoError(t, err, "the fleet has room again")
	s2.Release()
	assert.Zero(t, r.Stats().RemovalsDropped)
}

// slots.Unlimited (math.MaxInt) is a valid limit for the script, keys with
// braces or empty keys work, and limit 0 rejects.
func TestUnlimitedZeroAndOddKeys(t *testing.T) {
	srv := fleettest.Start(t)
	r := New[string](srv.Client(), "u", slots.Unlimited)
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
	assert.Zero(t, r.Stats().RedisErrors)
	assert.Panics(t, func() { New[string](srv.Client(), "a{b", 1) })
	assert.Panics(t, func() { New[string](nil, "a", 1) })
}

// Releases after Close send nothing, start nothing and do not block: the
// leases expire after the TTL (goleak checks the goroutines at the end).
func TestReleaseAfterClose(t *testing.T) {
	m := newMini(t)
	r := New[string](m.client(), "t", 10000, WithLeaseTTL(3*time.Second))
	var held []*slots.Slot
	for range 50 {
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		held = append(held, s)
	}
	r.Close()
	for _, s := range held {
		s.Release()
	}
	assert.Zero(t, r.Stats().RemovalsPending)
	assert.Zero(t, r.Local().InFlight("k"), "the local mirror is released")
}

// Within a process, fleet waiters go by priority class, then arrival: an
// interactive request that comes after three batch ones waiting on a full
// key is admitted first.
//
// Each waits on k and a free key of its own, so that blocked narrows to k
// only once it has been told k is full (or is held back on it): a waiter
// still on its way to Redis could otherwise be admitted after the release,
// ahead of the interactive one. No polls (a minute away): the release's
// wake-up moves the first waiter, and each dequeue the next.
func TestWaitersByClass(t *testing.T) {
	m := newMini(t)
	r := m.registry(1, WithLeaseTTL(time.Minute), WithPoll(time.Minute, time.Minute))
	<-r.subscribed
	hold, err := r.TryAcquire("k")
	require.NoError(t, err)
	allBlocked := func(n int) func() bool {
		return func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.waiting != n {
				return false
			}
			for _, w := range r.allWaiters() {
				if len(w.blocked) != 1 {
					return false // not told yet that k is full
				}
			}
			return true
		}
	}
	type admitted struct {
		prio slots.Priority
		s    *slots.Slot
	}
	got := make(chan admitted, 4)
	n := 0
	acquire := func(p slots.Priority) {
		n++
		own := fmt.Sprint("free", n)
		go func() {
			s, err := r.AcquireAll(slots.WithPriority(context.Background(), p), "k", own)
			assert.NoError(t, err)
			got <- admitted{p, s}
		}()
	}
	for range 3 {
		acquire(slots.PriorityBatch)
	}
	eventually(t, "three batch waiters find k full", allBlocked(3))
	acquire(slots.PriorityInteractive)
	eventually(t, "and the interactive one, ahead of them", allBlocked(4))
	r.mu.Lock()
	assert.Equal(t, core.Rank(core.ClassHigh), r.queues["inflight:{t}:k"][0].rank)
	r.mu.Unlock()

	hold.Release()
	next := func() admitted {
		select {
		case a := <-got:
			return a
		case <-time.After(5 * time.Second):
			t.Fatal("no waiter admitted: a wake-up lost")
			return admitted{}
		}
	}
	first := next()
	assert.Equal(t, slots.PriorityInteractive, first.prio, "the interactive request goes first")
	first.s.Release()
	for range 3 {
		a := next()
		assert.Equal(t, slots.PriorityBatch, a.prio)
		a.s.Release()
	}
}
