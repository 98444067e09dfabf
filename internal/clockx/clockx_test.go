package clockx_test

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/clockx"
	"github.com/inflight-go/inflight/internal/testrig"
)

func TestMockClock(t *testing.T) {
	mock := clock.NewMock()
	start := mock.Now()
	c := clockx.New(mock)
	assert.Equal(t, int64(0), c.Nanos())
	mock.Add(90 * time.Second)
	n := c.Nanos()
	assert.Equal(t, int64(90*time.Second), n)
	assert.True(t, c.Time(n).Equal(start.Add(90*time.Second)))

	ch, stop := c.Timer(time.Minute)
	mock.Add(time.Minute)
	select {
	case <-ch:
	default:
		t.Fatal("the mock timer did not fire")
	}
	stop()
}

func TestRealClock(t *testing.T) {
	c := clockx.New(nil)
	a := c.Nanos()
	b := c.Nanos()
	assert.LessOrEqual(t, a, b, "monotonic")
	assert.WithinDuration(t, time.Now(), c.Time(c.Nanos()), time.Second)
	_, stop := c.Timer(time.Hour)
	assert.True(t, stop())
}

func TestCoarse(t *testing.T) {
	t.Run("an injected clock is read exactly", func(t *testing.T) {
		mock := clock.NewMock()
		c := clockx.New(mock)
		mock.Add(1234 * time.Nanosecond)
		assert.Equal(t, int64(1234), c.Coarse())
	})
	t.Run("inside a synctest bubble: exact, and no ticker", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			c := clockx.New(nil)
			start := time.Now()
			for range 5 {
				time.Sleep(3 * time.Millisecond)
				assert.Equal(t, time.Since(start), time.Duration(c.Coarse()))
			}
			// Returning now would panic if a ticker goroutine were asleep.
		})
	})
	t.Run("inside a bubble whose clock has run for years", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			time.Sleep(3 * 366 * 24 * time.Hour) // past 2001 on the fake clock
			c := clockx.New(nil)
			start := c.Nanos()
			time.Sleep(time.Millisecond)
			assert.Equal(t, start+int64(time.Millisecond), c.Coarse(), "still exact: no ticker")
		})
	})
	t.Run("the real clock: at most one tick behind, and the ticker ends when unused", func(t *testing.T) {
		c := clockx.New(nil)
		for range 20 {
			got := c.Coarse()
			now := c.Nanos()
			assert.LessOrEqual(t, got, now)
			assert.Less(t, time.Duration(now-got), clockx.CoarseTick+50*time.Millisecond, "about one tick behind (with room for a busy machine)")
		}
		// goleak in TestMain checks that the ticker has ended: it retries
		// for longer than the ticker's idle spell.
	})
}
