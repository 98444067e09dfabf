package slots_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// Each caller counts once in Stats: a context ended on arrival as Canceled
// (it was counted nowhere), and a grant given back because its caller's
// context ended as it came as Acquired and Released, not also as Canceled.
func TestStatsCountEachCallerOnce(t *testing.T) {
	lim := slots.NewLimiter(1)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := lim.Acquire(ended)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, slots.Stats{Limit: 1, Canceled: 1}, lim.Stats(), "ended on arrival")

	// One P: the waiter woken by the Release runs only once the test
	// goroutine blocks, after its context has ended too: it finds its
	// grant and its ended context together, and gives the grant back.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	lim = slots.NewLimiter(1)
	held, err := lim.TryAcquire()
	require.NoError(t, err)
	ctx, cancelWait := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		s, err := lim.Acquire(ctx)
		if err == nil {
			s.Release()
		}
		errc <- err
	}()
	for lim.Waiting() == 0 {
		runtime.Gosched()
	}
	held.Release()
	cancelWait()
	require.ErrorIs(t, <-errc, context.Canceled)
	assert.Equal(t, slots.Stats{Limit: 1, Acquired: 2, Waited: 1, Released: 2}, lim.Stats(),
		"the grant given back counts as acquired and released")
}

// On an injected clock a granted wait ends at the grant, whatever time the
// clock is moved to before the caller wakes; set back, it is never negative.
func TestWaitOnAnInjectedClock(t *testing.T) {
	mock := clock.NewMock()
	waits := make(chan time.Duration, 4)
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventAcquired && e.Wait > 0 || e.Kind == slots.EventRejected {
			waits <- e.Wait
		}
	})
	lim := slots.NewLimiter(1, slots.WithClock(mock), slots.WithObserver(obs))
	held, err := lim.TryAcquire()
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		s, err := lim.Acquire(context.Background())
		if err == nil {
			s.Release()
		}
		got <- err
	}()
	for lim.Waiting() == 0 {
		runtime.Gosched()
	}
	mock.Add(2 * time.Second)
	held.Release()
	mock.Add(time.Hour) // before or after the waiter wakes
	require.NoError(t, <-got)
	assert.Equal(t, 2*time.Second, <-waits, "waited until the grant")

	held, err = lim.TryAcquire()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := lim.Acquire(ctx)
		got <- err
	}()
	for lim.Waiting() == 0 {
		runtime.Gosched()
	}
	mock.Set(mock.Now().Add(-time.Minute)) // set back
	cancel()
	require.ErrorIs(t, <-got, context.Canceled)
	assert.Equal(t, time.Duration(0), <-waits, "never negative")
	held.Release()
}
