package clockx_test

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/clockx"
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
	assert.WithinDuration(t, time.Now(), c.Now(), time.Second)
	_, stop := c.Timer(time.Hour)
	assert.True(t, stop())
}
