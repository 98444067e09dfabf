package registry_test

import (
	"context"
	"errors"
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
