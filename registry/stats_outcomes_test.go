package registry_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
)

// Each caller counts once in Stats: a context ended on arrival as Canceled
// (it was counted nowhere), on one key or several, and a grant given back
// because its caller's context ended as it came as Acquired and Released,
// not also as Canceled.
func TestStatsCountEachCallerOnce(t *testing.T) {
	reg := registry.New[string](1)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := reg.Acquire(ended, "k")
	require.ErrorIs(t, err, context.Canceled)
	_, err = reg.AcquireAll(ended, "k", "l")
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, registry.Stats{Canceled: 2}, reg.Stats(), "ended on arrival")

	// One P: the waiter woken by the Release runs only once the test
	// goroutine blocks, after its context has ended too: it finds its
	// grant and its ended context together, and gives the grant back.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	reg = registry.New[string](1)
	held, err := reg.TryAcquire("k")
	require.NoError(t, err)
	ctx, cancelWait := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		s, err := reg.Acquire(ctx, "k")
		if err == nil {
			s.Release()
		}
		errc <- err
	}()
	for reg.Waiting("k") == 0 {
		runtime.Gosched()
	}
	held.Release()
	cancelWait()
	require.ErrorIs(t, <-errc, context.Canceled)
	assert.Equal(t, registry.Stats{Acquired: 2, Waited: 1, Released: 2}, reg.Stats(),
		"the grant given back counts as acquired and released")
}
