package slots_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// copySlot copies a Slot the way careless code would (go vet flags a plain
// copy, so reflection stands in for it).
func copySlot(s *slots.Slot) *slots.Slot {
	c := new(slots.Slot)
	reflect.ValueOf(c).Elem().Set(reflect.ValueOf(s).Elem())
	return c
}

// A copy of a Slot is misuse: releasing it frees nothing and reports false,
// and the original keeps its capacity until it is released itself.
func TestReleasingACopyFreesNothing(t *testing.T) {
	t.Run("a Limiter slot", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		s, err := lim.TryAcquire()
		require.NoError(t, err)
		assert.False(t, copySlot(s).Release(), "the copy freed nothing")
		assert.Equal(t, 1, lim.InFlight())
		assert.Equal(t, uint64(1), lim.Stats().DoubleReleases, "counted as misuse")
		assert.True(t, s.Release())
		assert.Zero(t, lim.InFlight())
	})
	t.Run("a Limiter slot with leak detection", func(t *testing.T) {
		lim := slots.NewLimiter(1, slots.WithLeakDetection())
		s, err := lim.TryAcquire()
		require.NoError(t, err)
		assert.False(t, copySlot(s).Release())
		assert.Equal(t, 1, lim.InFlight())
		assert.True(t, s.Release())
		assert.Zero(t, lim.InFlight())
	})
	t.Run("a bypassed slot", func(t *testing.T) {
		mock := clock.NewMock()
		lim := slots.NewLimiter(0, slots.WithClock(mock), slots.WithMaxWait(time.Second), slots.WithFailOpen())
		got := make(chan *slots.Slot)
		go func() {
			s, err := lim.Acquire(context.Background())
			assert.NoError(t, err)
			got <- s
		}()
		require.Eventually(t, func() bool { return lim.Waiting() == 1 }, 5*time.Second, time.Millisecond)
		mock.Add(time.Second)
		s := <-got
		require.True(t, s.Bypassed())
		assert.False(t, copySlot(s).Release(), "the copy of a bypass reports false")
		assert.Equal(t, uint64(1), lim.Stats().DoubleReleases)
		assert.True(t, s.Release(), "the bypass itself reports true once")
		assert.False(t, s.Release())
	})
	t.Run("a Combine slot", func(t *testing.T) {
		a, b := slots.NewLimiter(1), slots.NewLimiter(1)
		sa, err := a.TryAcquire()
		require.NoError(t, err)
		sb, err := b.TryAcquire()
		require.NoError(t, err)
		c := slots.Combine(sa, sb)
		assert.False(t, copySlot(c).Release(), "the copy freed nothing")
		assert.Equal(t, 1, a.InFlight(), "the original's parts are still held")
		assert.Equal(t, 1, b.InFlight())
		assert.True(t, c.Release())
		assert.Zero(t, a.InFlight()+b.InFlight())
	})
}
