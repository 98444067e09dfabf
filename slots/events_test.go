package slots_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// eventCounts tallies events by kind, and rejections by reason.
type eventCounts struct {
	acquired, rejected, bypassed, released, doubles atomic.Int64
	leaked                                          atomic.Int64
	mu                                              sync.Mutex
	reasons                                         map[string]int
	waits, holds                                    []time.Duration
}

func (c *eventCounts) Observe(e slots.Event) {
	switch e.Kind {
	case slots.EventAcquired:
		c.acquired.Add(1)
		c.mu.Lock()
		c.waits = append(c.waits, e.Wait)
		c.mu.Unlock()
	case slots.EventRejected:
		c.rejected.Add(1)
		c.mu.Lock()
		if c.reasons == nil {
			c.reasons = map[string]int{}
		}
		c.reasons[e.Err.Error()]++
		c.mu.Unlock()
	case slots.EventBypassed:
		c.bypassed.Add(1)
	case slots.EventReleased:
		c.released.Add(1)
		c.mu.Lock()
		c.holds = append(c.holds, e.Hold)
		c.mu.Unlock()
	case slots.EventDoubleRelease:
		c.doubles.Add(1)
	case slots.EventLeaked:
		c.leaked.Add(1)
	}
}

func TestLimiterEvents(t *testing.T) {
	mock := clock.NewMock()
	var ev eventCounts
	l := slots.NewLimiter(1, slots.WithClock(mock), slots.WithObserver(&ev), slots.WithMaxQueue(1))
	a, err := l.TryAcquire()
	require.NoError(t, err)
	_, err = l.TryAcquire()
	assert.ErrorIs(t, err, slots.ErrLimitReached)

	got := make(chan *slots.Slot)
	go func() {
		s, err := l.Acquire(context.Background())
		if assert.NoError(t, err) {
			got <- s
		}
	}()
	for l.Waiting() == 0 {
		runtimeGosched()
	}
	_, err = l.Acquire(context.Background())
	assert.ErrorIs(t, err, slots.ErrQueueFull)

	mock.Add(3 * time.Second)
	a.Release()
	b := <-got
	mock.Add(2 * time.Second)
	b.Release()
	b.Release()

	assert.Equal(t, int64(2), ev.acquired.Load())
	assert.Equal(t, int64(2), ev.released.Load())
	assert.Equal(t, int64(2), ev.rejected.Load())
	assert.Equal(t, int64(1), ev.doubles.Load())
	assert.Equal(t, map[string]int{slots.ErrLimitReached.Error(): 1, slots.ErrQueueFull.Error(): 1}, ev.reasons)
	assert.Equal(t, []time.Duration{0, 3 * time.Second}, ev.waits, "the second caller queued 3 s")
	assert.Equal(t, []time.Duration{3 * time.Second, 2 * time.Second}, ev.holds)
}

// TestLimiterEventsUnderLoad: with cancellations racing grants, every
// acquired event has its released event, and every attempt ends in exactly
// one acquired or rejected event.
func TestLimiterEventsUnderLoad(t *testing.T) {
	var ev eventCounts
	l := slots.NewLimiter(2, slots.WithObserver(&ev))
	var attempts atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				attempts.Add(1)
				ctx, cancel := context.WithCancel(context.Background())
				if (g+i)%3 == 0 {
					go cancel()
				}
				s, err := l.Acquire(ctx)
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected: %v", err)
					}
					continue
				}
				s.Release()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, attempts.Load(), ev.acquired.Load()+ev.rejected.Load())
	assert.Equal(t, ev.acquired.Load(), ev.released.Load(), "given-back grants report no release")
	assert.Equal(t, 0, l.InFlight())
}

// An Observer that panics on an admission does not keep the capacity: the
// Slot never reaches its caller, so it is released.
func TestObserverPanicOnAdmissionKeepsNothing(t *testing.T) {
	var armed atomic.Bool
	obs := slots.ObserverFunc(func(e slots.Event) {
		if armed.Load() && e.Kind == slots.EventAcquired {
			panic("observer")
		}
	})
	lim := slots.NewLimiter(1, slots.WithObserver(obs))
	armed.Store(true)
	for _, acquire := range []func() (*slots.Slot, error){
		lim.TryAcquire,
		func() (*slots.Slot, error) { return lim.Acquire(context.Background()) },
	} {
		assert.PanicsWithValue(t, "observer", func() { _, _ = acquire() })
		assert.Zero(t, lim.InFlight())
	}
}

type requestKey struct{}

// An admission's events carry the context its caller passed to Acquire,
// whatever the outcome (for a span on it), and a rejection after a wait
// says how long the caller waited; TryAcquire's events and releases carry
// none.
func TestEventsCarryTheCallersContext(t *testing.T) {
	mock := testrig.NewSettingClock()
	var log slotstest.Recorder
	l := slots.NewLimiter(1, slots.WithClock(mock), slots.WithObserver(&log), slots.WithMaxWait(2*time.Second))
	ctx := context.WithValue(context.Background(), requestKey{}, "req")
	held, err := l.TryAcquire()
	require.NoError(t, err)

	acquire := func(ctx context.Context) <-chan error {
		errc := make(chan error, 1)
		go func() {
			_, err := l.Acquire(ctx)
			errc <- err
		}()
		for l.Waiting() == 0 {
			runtimeGosched()
		}
		return errc
	}
	// The clock moves once, when the waiter's timer is set (SettingClock).
	errc := acquire(ctx)
	mock.WaitSet(t, 1, 2*time.Second)
	mock.Add(2 * time.Second)
	require.ErrorIs(t, <-errc, slots.ErrWaitTimeout)
	cctx, cancel := context.WithCancel(ctx)
	errc = acquire(cctx)
	mock.Add(500 * time.Millisecond)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	held.Release()
	s, err := l.Acquire(ctx)
	require.NoError(t, err)
	s.Release()

	evs := log.Kinds()
	require.Equal(t, []slots.EventKind{slots.EventAcquired, slots.EventRejected, slots.EventRejected,
		slots.EventReleased, slots.EventAcquired, slots.EventReleased}, evs)
	all := log.Events()
	assert.Nil(t, all[0].Context, "TryAcquire has no context")
	assert.Equal(t, "req", all[1].Context.Value(requestKey{}))
	assert.Equal(t, 2*time.Second, all[1].Wait, "timed out after its wait")
	assert.Equal(t, cctx, all[2].Context)
	assert.Equal(t, 500*time.Millisecond, all[2].Wait, "gave up after its wait")
	assert.Nil(t, all[3].Context, "a release has no context")
	assert.Equal(t, "req", all[4].Context.Value(requestKey{}))
	assert.Zero(t, all[4].Wait)
}

// A caller that cannot queue (TryAcquire) is told when its slot frees, not
// earlier: a lead is for a caller that waits in the queue on its return.
func TestTryAcquireRetryAfterIsNotEarly(t *testing.T) {
	mock := clock.NewMock()
	l := slots.NewLimiter(1, slots.WithClock(mock), slots.WithMaxWait(time.Second))
	s, err := l.TryAcquire()
	require.NoError(t, err)
	mock.Add(time.Second)
	s.Release() // a hold of 1 s: the mean
	s, err = l.TryAcquire()
	require.NoError(t, err)
	mock.Add(200 * time.Millisecond)
	_, err = l.TryAcquire()
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 800*time.Millisecond, le.RetryAfter, "the holder started 200 ms ago, of a mean of 1 s")
	s.Release()
}

// gatedObserver is an Observer with Enabled that wants what want says, and
// records the contexts it was asked with and the Events it was told.
type gatedObserver struct {
	slotstest.Recorder
	want  func(ctx context.Context) bool
	mu    sync.Mutex
	asked []context.Context
}

func (g *gatedObserver) Enabled(ctx context.Context) bool {
	g.mu.Lock()
	g.asked = append(g.asked, ctx)
	g.mu.Unlock()
	return g.want(ctx)
}

// An Observer with Enabled is asked before each Event, with the admission's
// context (nil for releases and TryAcquire), and told only the Events it
// wants; one that wants none costs no Event at all.
func TestEnabledObserverIsAskedFirst(t *testing.T) {
	traced := context.WithValue(context.Background(), requestKey{}, "traced")
	g := &gatedObserver{want: func(ctx context.Context) bool { return ctx == traced }}
	l := slots.NewLimiter(1, slots.WithObserver(g), slots.WithMaxQueue(0))

	s, err := l.Acquire(context.Background()) // not wanted
	require.NoError(t, err)
	_, err = l.Acquire(traced) // refused, wanted
	require.ErrorIs(t, err, slots.ErrQueueFull)
	s.Release() // asked with nil: not wanted
	s, err = l.Acquire(traced)
	require.NoError(t, err)
	s.Release()
	s.Release()             // a double release: asked with nil
	_, err = l.TryAcquire() // asked with nil
	require.NoError(t, err)

	assert.Equal(t, []slots.EventKind{slots.EventRejected, slots.EventAcquired}, g.Kinds())
	for _, e := range g.Events() {
		assert.Equal(t, traced, e.Context)
	}
	g.mu.Lock()
	assert.Equal(t, []context.Context{context.Background(), traced, nil, traced, nil, nil, nil}, g.asked)
	g.mu.Unlock()

	// A second WithObserver replaces the first, and with it the question.
	var plain slotstest.Recorder
	l = slots.NewLimiter(1, slots.WithObserver(g), slots.WithObserver(&plain))
	s, err = l.Acquire(context.Background())
	require.NoError(t, err)
	s.Release()
	assert.Equal(t, []slots.EventKind{slots.EventAcquired, slots.EventReleased}, plain.Kinds())
}

// An Enabled that panics on an admission keeps nothing, as an Observe
// that panics does.
func TestEnabledPanicOnAdmissionKeepsNothing(t *testing.T) {
	g := &gatedObserver{want: func(ctx context.Context) bool { panic("enabled") }}
	lim := slots.NewLimiter(1, slots.WithObserver(g), slots.WithMaxQueue(0))
	for _, acquire := range []func() (*slots.Slot, error){
		lim.TryAcquire,
		func() (*slots.Slot, error) { return lim.Acquire(context.Background()) },
	} {
		assert.PanicsWithValue(t, "enabled", func() { _, _ = acquire() })
		assert.Zero(t, lim.InFlight())
	}
}
