package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/slots"
)

// callHook watches and steers the acquire calls of a client: it can hold
// the next call sent alone, hold the pipelines, or make the pipelines run
// on the server and then fail on the client's side (as a timeout would).
type callHook struct {
	holdAlone atomic.Bool   // the next call sent alone waits for openAlone
	openAlone chan struct{} // closed to let it go
	holdPipes chan struct{} // not nil: pipelines wait for it to close, or for their context
	late      atomic.Bool   // pipelines run on the server, then fail on the client's side

	mu        sync.Mutex
	pipes     []int       // the size of each acquire pipeline sent
	deadlines []time.Time // each one's context deadline
}

func newCallHook() *callHook { return &callHook{openAlone: make(chan struct{})} }

// isAcquire reports whether cmd runs the Redis store's acquire script:
// the only script whose first key is the fleet's epoch and whose fourth is
// its processes' liveness.
func isAcquire(cmd redis.Cmder) bool {
	args := cmd.Args()
	if name := cmd.Name(); (name != "evalsha" && name != "eval") || len(args) < 7 {
		return false
	}
	return strings.HasSuffix(fmt.Sprint(args[3]), "#epoch") && strings.HasSuffix(fmt.Sprint(args[6]), "#procs")
}

func (h *callHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *callHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isAcquire(cmd) && h.holdAlone.CompareAndSwap(true, false) {
			<-h.openAlone
		}
		return next(ctx, cmd)
	}
}
func (h *callHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !isAcquire(cmds[0]) {
			return next(ctx, cmds)
		}
		d, _ := ctx.Deadline()
		h.mu.Lock()
		h.pipes = append(h.pipes, len(cmds))
		h.deadlines = append(h.deadlines, d)
		h.mu.Unlock()
		if h.holdPipes != nil {
			select {
			case <-h.holdPipes:
			case <-ctx.Done():
				for _, c := range cmds {
					c.SetErr(ctx.Err())
				}
				return ctx.Err()
			}
		}
		if h.late.Load() {
			_ = next(context.Background(), cmds) // the server runs them...
			for _, c := range cmds {
				c.SetErr(context.DeadlineExceeded) // ...but the client gives up
			}
			return context.DeadlineExceeded
		}
		return next(ctx, cmds)
	}
}

func (h *callHook) sent() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.pipes...)
}

// queued returns how many acquire calls wait for a pipeline.
func (r *Registry[K]) queued() int {
	r.calls.mu.Lock()
	defer r.calls.mu.Unlock()
	return len(r.calls.pending)
}

// pipelined sets up a Registry on m whose next call sent alone is held by
// the returned hook, with one call on its way at most: the calls made
// after it queue for a pipeline.
func pipelined(t *testing.T, m *mini, limit int, opts ...Option) (*Registry[string], *callHook) {
	return pipelinedWith(t, m, limit, nil, opts...)
}

// pipelinedWith is pipelined with more hooks on the client, after its own.
func pipelinedWith(t *testing.T, m *mini, limit int, more []redis.Hook, opts ...Option) (*Registry[string], *callHook) {
	c := m.client()
	h := newCallHook()
	c.AddHook(h)
	for _, x := range more {
		c.AddHook(x)
	}
	r := New[string](redisstore.New(c, "t"), limit, append([]Option{WithLeaseTTL(3 * time.Second)}, opts...)...)
	t.Cleanup(r.Close)
	r.calls.max = 1
	return r, h
}

// holdAlone starts a TryAcquire on key whose call is held, and returns its
// result once the hook lets it go.
func holdAlone(t *testing.T, r *Registry[string], h *callHook, key string) <-chan *slots.Slot {
	h.holdAlone.Store(true)
	out := make(chan *slots.Slot, 1)
	go func() {
		s, _ := r.TryAcquire(key)
		out <- s
	}()
	eventually(t, "the call sent alone is held", func() bool { return !h.holdAlone.Load() })
	return out
}

type result struct {
	s   *slots.Slot
	err error
}

// queue starts n TryAcquire calls on key and waits until all have queued.
func queue(t *testing.T, r *Registry[string], n int, key string) <-chan result {
	out := make(chan result, n)
	before := r.queued()
	for range n {
		go func() {
			s, err := r.TryAcquire(key)
			out <- result{s, err}
		}()
	}
	eventually(t, "the calls queue", func() bool { return r.queued() == before+n })
	return out
}

// pipelineOnItsWay sets up a Registry on m (call timeout 15 s) with n calls
// on key "k" in a pipeline that h holds until its context ends, behind a
// first call, admitted, whose Slot it returns.
func pipelineOnItsWay(t *testing.T, m *mini, n int) (*Registry[string], *callHook, *slots.Slot, <-chan result) {
	t.Helper()
	r, h := pipelined(t, m, 100, WithTimeout(time.Minute/4), WithLeaseTTL(time.Minute))
	h.holdPipes = make(chan struct{})
	first := holdAlone(t, r, h, "k")
	inPipe := queue(t, r, n, "k")
	close(h.openAlone)
	s := <-first
	require.NotNil(t, s)
	eventually(t, "the pipeline is on its way", func() bool { return len(h.sent()) == 1 })
	return r, h, s, inPipe
}

// Calls made while one is on its way go together, as one pipeline, and
// the script decides each in turn: with room for 5, the held call and 4
// of the 8 queued ones are admitted.
func TestOverlappingCallsSharePipeline(t *testing.T) {
	m := newMini(t)
	r, h := pipelined(t, m, 5)
	first := holdAlone(t, r, h, "k")
	results := queue(t, r, 8, "k")
	close(h.openAlone)
	held := []*slots.Slot{<-first}
	require.NotNil(t, held[0])
	rejected := 0
	for range 8 {
		res := <-results
		if res.err != nil {
			require.ErrorIs(t, res.err, slots.ErrLimitReached)
			rejected++
			continue
		}
		held = append(held, res.s)
	}
	assert.Equal(t, []int{8}, h.sent(), "one pipeline of all 8")
	assert.Equal(t, 4, rejected)
	assert.Len(t, m.leases("k"), 5)
	assert.Equal(t, 5, r.Local().InFlight("k"))
	for _, s := range held {
		s.Release()
	}
	eventually(t, "all released", func() bool { return len(m.leases("k")) == 0 })
	assert.Zero(t, r.Stats().StoreErrors)
}

// A queued call whose caller gives up is not sent, and leaves nothing to
// take back.
func TestQueuedCallCancelledIsNotSent(t *testing.T) {
	m := newMini(t)
	r, h := pipelined(t, m, 10)
	first := holdAlone(t, r, h, "k")
	results := queue(t, r, 2, "k")
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := r.Acquire(ctx, "k")
		gone <- err
	}()
	eventually(t, "queued", func() bool { return r.queued() == 3 })
	cancel()
	require.ErrorIs(t, <-gone, context.Canceled)
	assert.Equal(t, 2, r.queued())
	close(h.openAlone)
	(<-first).Release()
	for range 2 {
		res := <-results
		require.NoError(t, res.err)
		res.s.Release()
	}
	assert.Equal(t, []int{2}, h.sent())
	eventually(t, "all released", func() bool { return len(m.leases("k")) == 0 && r.Stats().RemovalsPending == 0 })
	assert.Zero(t, tombstones(m), "nothing was abandoned")
}

// A pipeline that fails counts as one failure for the breaker, not one
// per call; its calls, which ran on the server, are taken back.
func TestFailedPipelineCountsOnce(t *testing.T) {
	m := newMini(t)
	r, h := pipelined(t, m, 100, WithBreaker(3, time.Hour), WithUnavailable(FailClosed))
	first := holdAlone(t, r, h, "k")
	results := queue(t, r, 10, "k")
	h.late.Store(true)
	close(h.openAlone)
	s := <-first
	require.NotNil(t, s)
	for range 10 {
		res := <-results
		require.ErrorIs(t, res.err, ErrUnavailable)
	}
	st := r.Stats()
	assert.Equal(t, uint64(1), st.StoreErrors)
	assert.False(t, st.BreakerOpen, "one failed pipeline does not open a breaker of 3")
	eventually(t, "what the late calls took is taken back", func() bool { return len(m.leases("k")) == 1 })
	s.Release()
	eventually(t, "released", func() bool { return len(m.leases("k")) == 0 })
}

// Calls queued when the breaker opens are not sent: they are decided as
// WithUnavailable says (here, under the local registry).
func TestBreakerOpenWhileQueued(t *testing.T) {
	m := newMini(t)
	r, h := pipelined(t, m, 100, WithBreaker(1, time.Hour))
	first := holdAlone(t, r, h, "k")
	results := queue(t, r, 3, "k")
	m.Srv.SetError("LOADING down") // the held call fails and opens the breaker
	close(h.openAlone)
	held := []*slots.Slot{<-first}
	for range 3 {
		res := <-results
		require.NoError(t, res.err)
		held = append(held, res.s)
	}
	for _, s := range held {
		assert.True(t, s.Degraded())
	}
	assert.Empty(t, h.sent(), "no pipeline sent")
	// The held call failed and opened the breaker; it was sent, so the
	// releaser abandons it, or rather keeps its abandon until the breaker
	// closes. The queued calls were never sent.
	eventually(t, "the held call's abandon is kept for later", func() bool {
		return r.Stats().RemovalsPending == 1
	})
	assert.Equal(t, uint64(1), r.Stats().StoreErrors)
	m.Srv.SetError("")
	for _, s := range held {
		s.Release()
	}
}

// A pipeline ends by its newest call's deadline: WithTimeout after that
// call was made.
func TestPipelineDeadline(t *testing.T) {
	m := newMini(t)
	const timeout = 2 * time.Second
	r, h := pipelined(t, m, 100, WithTimeout(timeout), WithLeaseTTL(time.Minute))
	first := holdAlone(t, r, h, "k")
	before := time.Now()
	results := queue(t, r, 3, "k")
	after := time.Now()
	close(h.openAlone)
	(<-first).Release()
	for range 3 {
		res := <-results
		require.NoError(t, res.err)
		res.s.Release()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.deadlines, 1)
	d := h.deadlines[0]
	assert.False(t, d.Before(before.Add(timeout)), "deadline %v, queued after %v", d, before)
	assert.False(t, d.After(after.Add(timeout)), "deadline %v, queued before %v", d, after)
}

// NOSCRIPT in a pipeline (after SCRIPT FLUSH): the calls are sent again as
// EVAL, and admitted.
func TestPipelineNoScript(t *testing.T) {
	m := newMini(t)
	r, h := pipelined(t, m, 100)
	first := holdAlone(t, r, h, "k")
	results := queue(t, r, 3, "k")
	require.NoError(t, m.client().ScriptFlush(context.Background()).Err())
	close(h.openAlone)
	(<-first).Release()
	for range 3 {
		res := <-results
		require.NoError(t, res.err)
		assert.False(t, res.s.Degraded())
		res.s.Release()
	}
	assert.Equal(t, []int{3}, h.sent())
	assert.Zero(t, r.Stats().StoreErrors)
}

// Close fails the queued calls at once and cuts short a pipeline on its
// way: its calls fail with ErrClosed and are taken back (tombstoned), and
// Close does not wait for the call timeout.
func TestCloseCutsPipeline(t *testing.T) {
	m := newMini(t)
	r, h, s, inPipe := pipelineOnItsWay(t, m, 3)
	stillQueued := queue(t, r, 2, "k")
	start := time.Now()
	r.Close()
	assert.Less(t, time.Since(start), 10*time.Second, "Close does not wait for the pipeline")
	for range 3 {
		assert.ErrorIs(t, (<-inPipe).err, ErrClosed)
	}
	for range 2 {
		assert.ErrorIs(t, (<-stillQueued).err, ErrClosed)
	}
	tombs := tombstones(m)
	assert.Equal(t, 3, tombs, "the cut pipeline's calls are abandoned")
	assert.Equal(t, []int{3}, h.sent())
	s.Release()
	_, err := r.TryAcquire("k")
	assert.True(t, errors.Is(err, ErrClosed))
}

// panicHook panics as a faulty client hook would: in the next acquire call
// sent alone (alone; with after, once the call has run on the server), or
// in every pipeline of script calls, whichever script (pipes).
type panicHook struct {
	alone atomic.Bool
	after bool
	pipes atomic.Bool
}

func (h *panicHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isAcquire(cmd) && h.alone.CompareAndSwap(true, false) {
			if h.after {
				_ = next(ctx, cmd)
			}
			panic("hook panics")
		}
		return next(ctx, cmd)
	}
}
func (h *panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if name := cmds[0].Name(); h.pipes.Load() && (name == "evalsha" || name == "eval") {
			panic("pipeline hook panics")
		}
		return next(ctx, cmds)
	}
}

// A call sent alone that panics (recovered by the caller, as net/http does
// for a handler) gives back its place: later calls are still sent.
func TestPanicInCallAloneFreesItsPlace(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicHook{}
	c.AddHook(h)
	r := New[string](redisstore.New(c, "t"), 10, WithLeaseTTL(3*time.Second))
	t.Cleanup(r.Close)
	for range maxSending {
		h.alone.Store(true)
		func() {
			defer func() { _ = recover() }()
			_, _ = r.TryAcquire("k")
		}()
	}
	r.calls.mu.Lock()
	sending := r.calls.sending
	r.calls.mu.Unlock()
	assert.Zero(t, sending, "no call is on its way")
	done := make(chan error, 1)
	go func() {
		s, err := r.TryAcquire("k")
		if err == nil {
			s.Release()
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second): // a bound on a hang, not a wait
		t.Fatalf("TryAcquire hangs: %d call(s) queued, none on its way", r.queued())
	}
}

// A caller that gives up while its call is in a pipeline on its way
// abandons it: the call, arriving after the tombstone, adds nothing.
func TestTakenThenCancelledAddsNothing(t *testing.T) {
	m := newMini(t)
	r, h := pipelined(t, m, 10)
	h.holdPipes = make(chan struct{})
	first := holdAlone(t, r, h, "k")
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() { _, err := r.Acquire(ctx, "k"); gone <- err }()
	eventually(t, "queued", func() bool { return r.queued() == 1 })
	close(h.openAlone)
	s := <-first
	require.NotNil(t, s)
	eventually(t, "the pipeline is on its way", func() bool { return len(h.sent()) == 1 })
	cancel()
	require.ErrorIs(t, <-gone, context.Canceled)
	eventually(t, "the abandon's tombstone is set", func() bool {
		for _, k := range m.Srv.Keys() {
			if strings.HasPrefix(k, "inflight:{t}:abandoned:") {
				return true
			}
		}
		return false
	})
	close(h.holdPipes) // the late call runs now
	eventually(t, "the pipeline is done", func() bool {
		r.calls.mu.Lock()
		defer r.calls.mu.Unlock()
		return r.calls.sending == 0
	})
	s.Release()
	eventually(t, "nothing left", func() bool { return len(m.leases("k")) == 0 && r.Stats().RemovalsPending == 0 })
}

// A call queued just now is not cut short by an older call in the same
// pipeline whose time is up: each caller keeps its own deadline.
func TestFreshCallKeepsItsDeadline(t *testing.T) {
	m := newMini(t)
	r, h := pipelined(t, m, 100, WithTimeout(time.Second), WithLeaseTTL(time.Minute))
	first := holdAlone(t, r, h, "k")
	old := queue(t, r, 1, "k")
	r.calls.mu.Lock()
	r.calls.pending[0].deadline = time.Now().Add(-time.Millisecond) // as if it queued for WithTimeout
	r.calls.mu.Unlock()
	fresh := queue(t, r, 1, "k")
	close(h.openAlone)
	s := <-first
	require.NotNil(t, s)
	o, f := <-old, <-fresh
	require.NoError(t, o.err)
	require.NoError(t, f.err)
	assert.False(t, f.s.Degraded(), "the fresh call is admitted under the fleet cap")
	assert.Zero(t, r.Stats().StoreErrors, "Redis did not fail")
	for _, x := range []*slots.Slot{s, o.s, f.s} {
		x.Release()
	}
}

// A queued call whose own deadline passes while its pipeline is on its way
// waits for Redis's answer, rather than being decided without it: here,
// on a key full across the fleet, it is refused, not admitted under the
// local registry alone (which would put the key over its cap once the
// lease is put back). The calls' latencies are modelled with sleeps, each
// with a margin of a quarter of the call timeout.
func TestQueuedCallWaitsForItsPipeline(t *testing.T) {
	m := newMini(t)
	const timeout = 2 * time.Second
	other := m.registry(1) // another process of the fleet
	x, err := other.TryAcquire("k")
	require.NoError(t, err) // k (cap 1) is full fleet-wide
	defer x.Release()

	r, h := pipelined(t, m, 1, WithTimeout(timeout), WithLeaseTTL(time.Minute))
	h.holdPipes = make(chan struct{})
	a := holdAlone(t, r, h, "a")
	cAt := time.Now()
	c := queue(t, r, 1, "k")
	time.Sleep(timeout / 2) // D comes half a timeout after C
	d := queue(t, r, 1, "k")
	close(h.openAlone)
	sa := <-a
	require.NotNil(t, sa)
	defer sa.Release()
	eventually(t, "C and D go as one pipeline", func() bool { return len(h.sent()) == 1 })
	// Redis answers after C's deadline, before D's (the pipeline's).
	time.Sleep(time.Until(cAt.Add(timeout + timeout/4)))
	close(h.holdPipes)
	cr, dr := <-c, <-d
	require.Equal(t, []int{2}, h.sent())
	require.ErrorIs(t, dr.err, slots.ErrLimitReached)
	require.ErrorIs(t, cr.err, slots.ErrLimitReached, "C is decided by Redis, not admitted alone")
	st := r.Stats()
	assert.Zero(t, st.StoreErrors)
	assert.Zero(t, st.Degraded)
	r.renew()
	assert.Len(t, m.leases("k"), 1)
}

// A call sent alone whose hook panics after the call ran on the server
// leaves no lease behind: the panic goes on to the caller, and the lease
// id is abandoned.
func TestPanicInCallAloneTakesBackItsLease(t *testing.T) {
	m := newMini(t)
	c := m.client()
	h := &panicHook{after: true}
	c.AddHook(h)
	r := New[string](redisstore.New(c, "t"), 10, WithLeaseTTL(time.Minute))
	t.Cleanup(r.Close)
	h.alone.Store(true)
	assert.Panics(t, func() { _, _ = r.TryAcquire("k") })
	eventually(t, "the lease is taken back", func() bool { return len(m.leases("k")) == 0 && tombstones(m) == 1 })
	assert.Zero(t, r.Stats().Held)
}

// A hook that panics in every pipeline, the abandons' included (on the
// releaser's goroutine), does not take the process down: the calls fail
// as failed calls do (here, admitted under the local registry), each
// pipeline counts once, and the abandons are left for the heartbeat.
func TestEveryPipelinePanics(t *testing.T) {
	m := newMini(t)
	p := &panicHook{}
	r, h := pipelinedWith(t, m, 10, []redis.Hook{p})
	p.pipes.Store(true)
	first := holdAlone(t, r, h, "k")
	results := queue(t, r, 2, "k")
	close(h.openAlone)
	(<-first).Release()
	for range 2 {
		res := <-results
		require.NoError(t, res.err)
		require.True(t, res.s.Degraded())
		res.s.Release()
	}
	// One failure for the acquire pipeline, and at least one for the
	// abandons' pipelines (sent again with backoff while they fail).
	eventually(t, "the abandons were tried, and kept to be sent again", func() bool {
		st := r.Stats()
		return st.RemovalsPending == 2 && st.StoreErrors >= 2
	})
	p.pipes.Store(false)
	eventually(t, "the abandons go through once the hook stops panicking", func() bool {
		return r.Stats().RemovalsPending == 0 && tombstones(m) == 2
	})
}

// A LimitFunc that panics in Release (the wake-up needs the limit) leaves
// the Registry usable: its lock is not held, the local mirror is freed, and
// the lease is still removed from Redis (by the limits of its admission),
// so the cap frees fleet-wide.
func TestLimitFuncPanicInRelease(t *testing.T) {
	m := newMini(t)
	var boom atomic.Bool
	r := NewWithKeys(redisstore.New(m.client(), "t"), 10, Keys[string]{Limit: func(string) int {
		if boom.Load() {
			panic("limit source gone")
		}
		return 10
	}}, WithLeaseTTL(3*time.Second))
	defer r.Close()
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.Len(t, m.leases("k"), 1)
	boom.Store(true)
	assert.Panics(t, func() { s.Release() })
	boom.Store(false)
	require.True(t, r.mu.TryLock(), "the Registry's lock is free")
	r.mu.Unlock()
	assert.Zero(t, r.Local().InFlight("k"))
	assert.Zero(t, r.Stats().Held)
	eventually(t, "the lease is removed from Redis", func() bool { return len(m.leases("k")) == 0 })
}
