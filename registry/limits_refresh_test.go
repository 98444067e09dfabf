package registry_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
)

// A RefreshLimits during a fetch that then fails leaves the limit stale
// once: the next admission's fetch, which starts after it, is fresh for
// the refresh interval (it was recorded stale too, and fetched once more).
func TestRefreshDuringAFailedFetch(t *testing.T) {
	var calls atomic.Int64
	read, release := make(chan struct{}), make(chan struct{})
	reg := registry.NewWithLimitFunc[string](3, func(context.Context, string) (int, error) {
		switch calls.Add(1) {
		case 2:
			close(read)
			<-release
			return 0, errors.New("store down")
		}
		return 5, nil
	}, time.Minute)
	keep, err := reg.TryAcquire("org") // fetch 1: 5; keeps the key live
	require.NoError(t, err)
	defer keep.Release()
	reg.RefreshLimits(func(string) bool { return true }) // stale: the next admission fetches
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := reg.TryAcquire("org") // fetch 2, fails
		assert.NoError(t, err)
		if s != nil {
			s.Release()
		}
	}()
	<-read
	reg.RefreshLimits(func(string) bool { return true }) // during fetch 2
	close(release)
	<-done
	require.Equal(t, int64(2), calls.Load())
	s, err := reg.TryAcquire("org") // fetch 3: after both refreshes
	require.NoError(t, err)
	s.Release()
	require.Equal(t, int64(3), calls.Load())
	s, err = reg.TryAcquire("org")
	require.NoError(t, err)
	s.Release()
	assert.Equal(t, int64(3), calls.Load(), "fetch 3 started after every RefreshLimits, yet its value was recorded stale and fetched once more")
}

// A RefreshLimits whose match panics leaves no shard locked: the panic
// reaches its caller, and the keys of every shard are still admitted,
// counted and refreshed. Found by a review (the shard it panicked in
// stayed locked for good).
func TestRefreshLimitsMatchPanics(t *testing.T) {
	reg := registry.NewWithLimitFunc[string](3, func(context.Context, string) (int, error) { return 5, nil }, time.Minute)
	for i := range 64 { // keys in many shards, their limits cached
		s, err := reg.TryAcquire(fmt.Sprint("org-", i))
		require.NoError(t, err)
		s.Release()
	}
	assert.Panics(t, func() { reg.RefreshLimits(func(string) bool { panic("the caller's bug") }) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 64 {
			s, err := reg.TryAcquire(fmt.Sprint("org-", i))
			assert.NoError(t, err)
			s.Release()
		}
		reg.Stats()
		reg.RefreshLimits(func(string) bool { return true })
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a shard stayed locked after the panic")
	}
}
