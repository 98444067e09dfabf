package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/slots"
)

// The fleet's queue through the Registry, on a real redis-server: its
// bounds from the wait options, and a waiter that gives up.

// queued returns the length of key's queue in Redis (name "qw").
func queuedIn(t *testing.T, srv *fleettest.Server, key string) int {
	t.Helper()
	n, err := srv.Client().ZCard(context.Background(), "inflight:{qw}:"+key+"#q").Result()
	require.NoError(t, err)
	return int(n)
}

// slots.WithMaxQueue and WithMaxQueuePerFlow among the local options bound
// the fleet's queue, counted across processes: a caller over a bound fails
// at once with ErrQueueFull and a Retry-After of at least a second.
func TestFleetQueueBounds(t *testing.T) {
	srv := fleettest.Start(t)
	opts := []Option{WithLocalOptions(slots.WithMaxQueue(3), slots.WithMaxQueuePerFlow(2))}
	a := New[string](srv.Client(), "qw", 1, opts...)
	defer a.Close()
	b := New[string](srv.Client(), "qw", 1, opts...)
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
	srv := fleettest.Start(t)
	r := New[string](srv.Client(), "qw", 1)
	defer r.Close()
	other := New[string](srv.Client(), "qw", 1)
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
	next := make(chan *slots.Slot, 1)
	go func() {
		s, err := other.Acquire(context.Background(), "k")
		assert.NoError(t, err)
		next <- s
	}()
	eventually(t, "the second waiter queued", func() bool { return queuedIn(t, srv, "k") == 2 })
	cancel()
	require.True(t, errors.Is(<-gone, context.Canceled))
	eventually(t, "the first waiter left the queue", func() bool { return queuedIn(t, srv, "k") == 1 })
	held.Release()
	select {
	case s := <-next:
		s.Release()
	case <-time.After(10 * time.Second): // a bound on a hang
		t.Fatal("the release was not handed to the next waiter")
	}
}

// A Registry closed while its caller waits takes the caller out of the
// fleet's queue: another process's waiter behind it gets the next release
// at once, not after a grant nobody claims and its own poll (here 30 s
// away).
func TestFleetCloseLeavesTheQueue(t *testing.T) {
	srv := fleettest.Start(t)
	holder := New[string](srv.Client(), "qw", 1)
	defer holder.Close()
	closing := New[string](srv.Client(), "qw", 1)
	other := New[string](srv.Client(), "qw", 1)
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
	next := make(chan *slots.Slot, 1)
	go func() {
		s, err := other.Acquire(context.Background(), "k")
		assert.NoError(t, err)
		next <- s
	}()
	eventually(t, "the other waiter queued behind", func() bool { return queuedIn(t, srv, "k") == 2 })
	closing.Close()
	require.ErrorIs(t, <-done, ErrClosed)
	held.Release()
	select {
	case s := <-next:
		s.Release()
	case <-time.After(10 * time.Second): // a bound on a hang
		t.Fatal("the release went to the closed Registry's waiter")
	}
}

// slots.WithMaxWait among the local options bounds a fleet wait: past it
// the caller leaves the queue and fails with ErrWaitTimeout, or, with
// slots.WithFailOpen, is admitted with a Bypassed Slot that holds nothing.
func TestFleetMaxWait(t *testing.T) {
	srv := fleettest.Start(t)
	const wait = 100 * time.Millisecond
	closed := New[string](srv.Client(), "qw", 1, WithLocalOptions(slots.WithMaxWait(wait)))
	defer closed.Close()
	open := New[string](srv.Client(), "qw", 1, WithLocalOptions(slots.WithMaxWait(wait), slots.WithFailOpen()))
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
