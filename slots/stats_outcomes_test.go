package slots_test

import (
	"context"
	"runtime"
	"testing"

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
