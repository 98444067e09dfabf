package core_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/core"
)

func TestEvery(t *testing.T) {
	var e core.Every
	sec := int64(time.Second)
	assert.True(t, e.Allow(5*sec, 10*time.Second), "the first event passes")
	assert.False(t, e.Allow(6*sec, 10*time.Second))
	assert.False(t, e.Allow(14*sec, 10*time.Second))
	assert.True(t, e.Allow(15*sec, 10*time.Second), "once the interval has passed")
	assert.False(t, e.Allow(16*sec, 10*time.Second))
}

func TestRetryAfter(t *testing.T) {
	var h core.HoldTime
	assert.Equal(t, time.Second, h.RetryAfter(10, 2), "nothing known: one second")
	h.Observe(int64(20 * time.Second))
	assert.Equal(t, 20*time.Second, h.RetryAfter(1, 2), "2 ahead, 2 slots of 20 s each")
	assert.Equal(t, 60*time.Second, h.RetryAfter(5, 2))
	assert.Equal(t, time.Second, h.RetryAfter(0, 100), "never under one second")
	assert.Equal(t, time.Second, h.RetryAfter(3, 0), "a closed key has no estimate")
	h.Observe(-1) // a clock that went backwards is ignored
	h.Observe(int64(4 * time.Second))
	assert.Equal(t, 18*time.Second, h.RetryAfter(0, 1), "the mean moves an eighth of the way")
}

func TestQueueFull(t *testing.T) {
	w := core.Policy{}
	assert.False(t, w.QueueFull(1_000_000), "unbounded by default")
	w.MaxQueue, w.BoundQueue = 2, true
	assert.False(t, w.QueueFull(1))
	assert.True(t, w.QueueFull(2))
	w.MaxQueue = 0
	assert.True(t, w.QueueFull(0), "a bound of zero never queues")
}

func TestRetryAfterBounded(t *testing.T) {
	var h core.HoldTime
	h.Observe(int64(10 * time.Hour))
	assert.Equal(t, core.MaxRetryAfter, h.RetryAfter(1<<40, 1), "no overflow, capped")
}
