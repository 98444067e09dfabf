package fleet

import (
	"context"
	"errors"
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

// The fleet's queue through the Registry, on a real redis-server: its
// bounds from the wait options, and a waiter that gives up.

// queued returns the length of key's queue in Redis (name "qw").
func queuedIn(t *testing.T, srv *redistest.Server, key string) int {
	t.Helper()
	n, err := srv.Client().ZCard(context.Background(), "inflight:{qw}:"+key+"#q").Result()
	require.NoError(t, err)
	return int(n)
}

// slots.WithMaxQueue and WithMaxQueuePerFlow among the local options bound
// the fleet's queue, counted across processes: a caller over a bound fails
// at once with ErrQueueFull and a Retry-After of at least a second.
func TestFleetQueueBounds(t *testing.T) {
	srv := redistest.Start(t)
	opts := []Option{WithLocalOptions(slots.WithMaxQueue(3), slots.WithMaxQueuePerFlow(2))}
	a := New[string](redisstore.New(srv.Client(), "qw"), 1, opts...)
	defer a.Close()
	b := New[string](redisstore.New(srv.Client(), "qw"), 1, opts...)
	defer b.Close()
	held, err := a.TryAcquire("k")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := func(r *Registry[string], flow string, want int) {
		go func() { _, _ = r.Acquire(slots.WithFlow(ctx, flow), "k") }()
		eventually(t, "queued", func() bool { return queuedIn(t, srv, "k") == want })
	}
	wait(a, "x", 1)
	wait(b, "x", 2)
	start := time.Now()
	_, err = a.Acquire(slots.WithFlow(context.Background(), "x"), "k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le, "flow x has 2 queued")
	assert.ErrorIs(t, err, slots.ErrQueueFull)
	assert.Equal(t, 2, le.Queued)
	assert.GreaterOrEqual(t, le.RetryAfter, time.Second)
	assert.Less(t, time.Since(start), 5*time.Second, "answered at once")
	wait(b, "y", 3)
	_, err = b.Acquire(slots.WithFlow(context.Background(), "z"), "k")
	require.ErrorAs(t, err, &le, "the queue has 3")
	assert.ErrorIs(t, err, slots.ErrQueueFull)
	assert.Equal(t, 3, le.Queued)
	cancel()
	eventually(t, "the waiters withdrew", func() bool { return queuedIn(t, srv, "k") == 0 })
	held.Release()
}

// A waiter whose context ends leaves the fleet's queue: the release goes
// to the next waiter at once, not when its poll (here 30 s away) finds the
// first one gone.
func TestFleetWaiterGivesUp(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 1)
	defer r.Close()
	other := New[string](redisstore.New(srv.Client(), "qw"), 1)
	defer other.Close()
	other.claim = time.Minute // its waiter asks again only after 30 s
	held, err := r.TryAcquire("k")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, err := r.Acquire(ctx, "k")
		gone <- err
	}()
	eventually(t, "the first waiter queued", func() bool { return queuedIn(t, srv, "k") == 1 })
	next := queueBehind(t, srv, other)
	cancel()
	require.True(t, errors.Is(<-gone, context.Canceled))
	eventually(t, "the first waiter left the queue", func() bool { return queuedIn(t, srv, "k") == 1 })
	held.Release()
	admittedNext(t, next, "the release was not handed to the next waiter")
}

// A Registry closed while its caller waits takes the caller out of the
// fleet's queue: another process's waiter behind it gets the next release
// at once, not after a grant nobody claims and its own poll (here 30 s
// away).
func TestFleetCloseLeavesTheQueue(t *testing.T) {
	srv := redistest.Start(t)
	holder := New[string](redisstore.New(srv.Client(), "qw"), 1)
	defer holder.Close()
	closing := New[string](redisstore.New(srv.Client(), "qw"), 1)
	other := New[string](redisstore.New(srv.Client(), "qw"), 1)
	defer other.Close()
	other.claim = time.Minute
	held, err := holder.TryAcquire("k")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := closing.Acquire(context.Background(), "k")
		done <- err
	}()
	eventually(t, "queued", func() bool { return queuedIn(t, srv, "k") == 1 })
	next := queueBehind(t, srv, other)
	closing.Close()
	require.ErrorIs(t, <-done, ErrClosed)
	held.Release()
	admittedNext(t, next, "the release went to the closed Registry's waiter")
}

// slots.WithMaxWait among the local options bounds a fleet wait: past it
// the caller leaves the queue and fails with ErrWaitTimeout, or, with
// slots.WithFailOpen, is admitted with a Bypassed Slot that holds nothing.
func TestFleetMaxWait(t *testing.T) {
	srv := redistest.Start(t)
	const wait = 100 * time.Millisecond
	closed := New[string](redisstore.New(srv.Client(), "qw"), 1, WithLocalOptions(slots.WithMaxWait(wait)))
	defer closed.Close()
	open := New[string](redisstore.New(srv.Client(), "qw"), 1, WithLocalOptions(slots.WithMaxWait(wait), slots.WithFailOpen()))
	defer open.Close()
	held, err := closed.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()

	start := time.Now()
	_, err = closed.Acquire(context.Background(), "k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, slots.ErrWaitTimeout)
	assert.Equal(t, "k", le.Key)
	assert.Equal(t, 1, le.Limit)
	assert.GreaterOrEqual(t, time.Since(start), wait)
	eventually(t, "the waiter left the queue", func() bool { return queuedIn(t, srv, "k") == 0 })

	s, err := open.Acquire(context.Background(), "k")
	require.NoError(t, err)
	assert.True(t, s.Bypassed())
	assert.False(t, s.Degraded(), "Redis is reachable")
	assert.Equal(t, uint64(1), open.Stats().Bypassed)
	n, err := open.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the bypass holds nothing")
	s.Release()
	eventually(t, "the waiter left the queue", func() bool { return queuedIn(t, srv, "k") == 0 })
}

// AcquireAll past the longest wait names the key that was full, with its
// limit and count, not the first of its keys.
func TestFleetMaxWaitNamesTheFullKey(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 5, WithLocalOptions(slots.WithMaxWait(100*time.Millisecond)))
	defer r.Close()
	r.SetLimit("b", 1)
	held, err := r.TryAcquire("b")
	require.NoError(t, err)
	defer held.Release()
	_, err = r.AcquireAll(context.Background(), "a", "b")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	assert.Equal(t, "b", le.Key, "names the full key")
	assert.Equal(t, 1, le.Limit)
	assert.Equal(t, 1, le.InFlight)
}

// A wait past the longest one tells the key's count and its queue: the
// others waiting, as a Limiter's wait tells (it has left).
func TestFleetMaxWaitCounts(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 1, WithLocalOptions(slots.WithMaxWait(100*time.Millisecond)))
	defer r.Close()
	held, err := r.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	_, err = r.Acquire(context.Background(), "k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 1, le.InFlight, "the key is full: 1 in flight")
	assert.Equal(t, 0, le.Queued, "it was queued, alone")
}

// The longest wait runs out after Redis admitted the lease, while it is
// recorded (here a slow Observer): the caller holds the lease. With
// WithFailOpen it used to be given back for a Bypassed Slot, and the cap
// of 1 then let a second caller in.
func TestFleetMaxWaitDoesNotBypassAnAdmission(t *testing.T) {
	srv := redistest.Start(t)
	var slow atomic.Bool
	slow.Store(true)
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventAcquired && slow.CompareAndSwap(true, false) {
			time.Sleep(300 * time.Millisecond) // a slow Observer
		}
	})
	r := New[string](redisstore.New(srv.Client(), "qw"), 1, WithLocalOptions(slots.WithMaxWait(100*time.Millisecond), slots.WithFailOpen(), slots.WithObserver(obs)))
	defer r.Close()
	s, err := r.Acquire(context.Background(), "k")
	require.NoError(t, err)
	defer s.Release()
	assert.False(t, s.Bypassed(), "Redis admitted it: the caller should hold the lease, not a bypass")
	_, err = r.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the cap of 1 holds while the first caller runs")
}

// Close begins while a waiter's call is on its way (Redis stopped); the
// longest wait runs out after. The caller gets ErrClosed, not a Bypassed
// Slot from a closed Registry.
func TestFleetMaxWaitAfterClose(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 1, WithTimeout(2*time.Second),
		WithLocalOptions(slots.WithMaxWait(200*time.Millisecond), slots.WithFailOpen()))
	// warm up: scripts loaded, connection made
	s0, err := r.TryAcquire("warm")
	require.NoError(t, err)
	s0.Release()
	srv.Stop()
	type res struct {
		s   *slots.Slot
		err error
	}
	done := make(chan res, 1)
	go func() {
		s, err := r.Acquire(context.Background(), "k")
		done <- res{s, err}
	}()
	eventually(t, "the waiter waits", func() bool { return r.Stats().Waiting == 1 })
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	got := <-done
	srv.Cont()
	<-closed
	if got.s != nil {
		t.Logf("slot bypassed=%v stats=%+v", got.s.Bypassed(), r.Stats())
		got.s.Release()
	}
	t.Logf("err=%v", got.err)
	assert.Nil(t, got.s, "a closed Registry admits nothing")
	assert.ErrorIs(t, got.err, ErrClosed)
}

// The caller's context cancelled about when the longest wait runs out:
// once it has ended, the error wraps its own (Canceled), not the bound's
// DeadlineExceeded.
func TestFleetMaxWaitParentCancelled(t *testing.T) {
	srv := redistest.Start(t)
	const wait = 5 * time.Millisecond
	r := New[string](redisstore.New(srv.Client(), "qw"), 1, WithLocalOptions(slots.WithMaxWait(wait)))
	defer r.Close()
	held, err := r.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	var wrong, timeouts, canceled int
	for i := 0; i < 300; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		stop := time.AfterFunc(wait+time.Duration(i%5)*100*time.Microsecond, cancel)
		_, err := r.Acquire(ctx, "k")
		stop.Stop()
		cancel()
		switch {
		case errors.Is(err, slots.ErrWaitTimeout):
			timeouts++
		case errors.Is(err, context.Canceled):
			canceled++
		case errors.Is(err, context.DeadlineExceeded):
			wrong++
		default:
			t.Fatalf("unexpected %v", err)
		}
	}
	t.Logf("timeouts=%d canceled=%d deadline-exceeded (parent was Canceled, no deadline)=%d", timeouts, canceled, wrong)
	assert.Zero(t, wrong)
}

// A longest wait <= 0 is no bound, and TryAcquire does not wait.
func TestFleetMaxWaitZeroIsNoBound(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 1, WithLocalOptions(slots.WithMaxWait(-time.Second), slots.WithFailOpen()))
	defer r.Close()
	held, err := r.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	_, err = r.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = r.Acquire(ctx, "k")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, slots.ErrWaitTimeout)
	assert.Zero(t, r.Stats().Bypassed)
}

// A Bypassed Slot's Release sends nothing and counts nothing twice; a
// second Release is a misuse.
func TestFleetMaxWaitBypassRelease(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 1, WithLocalOptions(slots.WithMaxWait(50*time.Millisecond), slots.WithFailOpen()))
	defer r.Close()
	held, err := r.TryAcquire("k")
	require.NoError(t, err)
	s, err := r.Acquire(context.Background(), "k")
	require.NoError(t, err)
	require.True(t, s.Bypassed())
	s.Release()
	s.Release()
	assert.Equal(t, uint64(1), r.Stats().Bypassed)
	assert.Equal(t, uint64(1), r.Stats().DoubleReleases)
	n, err := r.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "held still counted")
	held.Release()
	eventually(t, "empty", func() bool { n, _ := r.InFlight(context.Background(), "k"); return n == 0 })
}

// The longest wait bounds a call to Redis on its way too: with the server
// stopped, a caller whose bound is 100 ms is answered about then, not when
// its call gives up. The call gives up after 10 s at the soonest (the
// client's reads and the call's own timeout), so that the two answers are
// far apart on any machine. (The client must let a context's deadline end
// a call, as the package recommends: ContextTimeoutEnabled.)
func TestFleetMaxWaitBoundsACallOnItsWay(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, ContextTimeoutEnabled: true})
	defer c.Close()
	r := New[string](redisstore.New(c, "qw"), 1, WithTimeout(10*time.Second),
		WithLocalOptions(slots.WithMaxWait(100*time.Millisecond)))
	defer r.Close()
	held, err := r.TryAcquire("k") // fills the key, and the local registry too
	require.NoError(t, err)
	defer held.Release()
	srv.Stop()
	defer srv.Cont()
	start := time.Now()
	_, err = r.Acquire(context.Background(), "k")
	took := time.Since(start)
	assert.ErrorIs(t, err, slots.ErrWaitTimeout)
	t.Logf("answered after %v", took.Round(time.Millisecond))
	assert.GreaterOrEqual(t, took, 100*time.Millisecond, "not before its bound")
	assert.Less(t, took, 5*time.Second, "answered at its bound, not when the call gives up")
}

// A waiter whose try panics (its Keys.Limit) takes its place in the
// fleet's queue back: the next release goes to the waiter behind it, not
// to a grant nobody claims.
func TestFleetPanickingWaiterLeavesTheQueue(t *testing.T) {
	srv := redistest.Start(t)
	var boom atomic.Bool
	r := NewWithKeys(redisstore.New(srv.Client(), "qw"), 1, Keys[string]{Limit: func(string) int {
		if boom.Load() {
			panic("limit lookup failed")
		}
		return 1
	}})
	defer r.Close()
	holder := New[string](redisstore.New(srv.Client(), "qw"), 1)
	defer holder.Close()
	other := New[string](redisstore.New(srv.Client(), "qw"), 1)
	defer other.Close()
	other.claim = time.Minute // its waiter asks again only after 30 s
	held, err := holder.TryAcquire("k")
	require.NoError(t, err)
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		_, _ = r.Acquire(context.Background(), "k")
	}()
	eventually(t, "the first waiter queued", func() bool { return queuedIn(t, srv, "k") == 1 })
	next := queueBehind(t, srv, other)
	boom.Store(true)
	r.SetLimit("other", 1) // wakes r's waiter: its next try panics
	require.NotNil(t, <-panicked)
	eventually(t, "the panicking waiter left the queue", func() bool { return queuedIn(t, srv, "k") == 1 })
	held.Release()
	admittedNext(t, next, "the release went to the panicking waiter's place")
}

// queueBehind starts a waiter of other on "k" behind the one queued there
// already, and returns the channel of its Slot once admitted.
func queueBehind(t *testing.T, srv *redistest.Server, other *Registry[string]) <-chan *slots.Slot {
	t.Helper()
	next := make(chan *slots.Slot, 1)
	go func() {
		s, err := other.Acquire(context.Background(), "k")
		assert.NoError(t, err)
		next <- s
	}()
	eventually(t, "the second waiter queued", func() bool { return queuedIn(t, srv, "k") == 2 })
	return next
}

// admittedNext releases the Slot that next delivers, failing with why if
// none comes within 10 s (a bound on a hang).
func admittedNext(t *testing.T, next <-chan *slots.Slot, why string) {
	t.Helper()
	select {
	case s := <-next:
		s.Release()
	case <-time.After(10 * time.Second):
		t.Fatal(why)
	}
}
