package core_test

import (
	"math"
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
	sec := int64(time.Second)
	var h core.HoldTime
	told := new(core.Told)
	assert.Equal(t, 5*time.Second, h.RetryAfter(0, 1, 10, 2, nil, 0, told), "nothing known: a second a hold, 10 turns of half a second")
	assert.Equal(t, time.Second, h.RetryAfter(0, 1, 4, 0, nil, 0, told), "a closed key has no estimate")

	var e core.HoldTime
	e.Observe(20 * sec)
	told = new(core.Told)
	assert.Equal(t, 20*time.Second, e.RetryAfter(0, 1, 2, 2, nil, 0, told), "2 ahead, 2 slots of 20 s each")
	assert.Equal(t, 30*time.Second, e.RetryAfter(0, 1, 2, 2, nil, 0, told), "the next caller refused at once goes a turn later")
	assert.Equal(t, 10*time.Second, e.RetryAfter(31*sec, 1, 1, 2, nil, 0, told), "once the returns told are due, a turn from now")
	assert.Equal(t, 9*time.Second, e.RetryAfter(100*sec, 1, 1, 2, nil, time.Second, told), "back a lead before its slot frees")
	assert.Equal(t, 10*time.Second, e.RetryAfter(100*sec, 1, 1, 2, nil, 0, nil), "nothing told: no spread")
	assert.Equal(t, 10*time.Second, e.RetryAfter(100*sec, 1, 1, 2, nil, 0, nil))

	// From the holders' starts: the first slot frees a mean hold after the
	// oldest start, the next after the next start, and so on, round after
	// round.
	var s core.HoldTime
	s.Observe(10 * sec)
	told = new(core.Told)
	starts := []core.End{{At: 7 * sec, Units: 1}, {At: 2 * sec, Units: 1}}
	assert.Equal(t, 2*time.Second, s.RetryAfter(10*sec, 1, 1, 2, starts, 0, told), "the oldest hold ends at 12 s")
	assert.Equal(t, 7*time.Second, s.RetryAfter(10*sec, 1, 1, 2, starts, 0, told), "then the other, at 17 s")
	assert.Equal(t, 12*time.Second, s.RetryAfter(10*sec, 1, 1, 2, starts, 0, told), "then the oldest's next holder, at 22 s")
	var o core.HoldTime
	o.Observe(10 * sec)
	told = new(core.Told)
	assert.Equal(t, time.Millisecond, o.RetryAfter(30*sec, 1, 1, 1, []core.End{{At: 1 * sec, Units: 1}}, 0, told), "a hold past its mean ends any moment")

	var r core.HoldTime
	r.Observe(int64(1500 * time.Microsecond))
	told = new(core.Told)
	assert.Equal(t, 2*time.Millisecond, r.RetryAfter(0, 1, 1, 1, nil, 0, told), "rounded up to the millisecond")
	r.Observe(-1) // a clock that went backwards is ignored
	assert.Equal(t, 3*time.Millisecond, r.RetryAfter(0, 1, 1, 1, nil, 0, told), "a turn after the last told")

	// Out-of-range inputs (a bad reply from a store, a wait of hours) give
	// a long answer, not a millisecond.
	var long core.HoldTime
	long.Observe(int64(10 * time.Hour))
	assert.Equal(t, core.MaxRetryAfter, long.RetryAfter(0, 1, math.MaxInt, 1, nil, 0, new(core.Told)), "a queue of MaxInt does not wrap")
	assert.Equal(t, core.MaxRetryAfter, long.RetryAfter(0, 1, -4, 1, nil, 0, new(core.Told)), "a negative queue counts as none")
	assert.Equal(t, core.MaxRetryAfter, long.RetryAfter(0, 1, 1, 1, nil, time.Hour, new(core.Told)), "the lead comes off before the bound")
}

// TestToldGivesBackAFloodsList: once the returns of a flood of refusals are
// due, the list they took is given back.
func TestToldGivesBackAFloodsList(t *testing.T) {
	var h core.HoldTime
	h.Observe(int64(time.Second))
	told := new(core.Told)
	for range 500 {
		h.RetryAfter(0, 1, 1, 1000, nil, 0, told)
	}
	assert.Equal(t, 500, told.Len())
	h.RetryAfter(int64(time.Hour), 1, 1, 1000, nil, 0, told)
	assert.Equal(t, 1, told.Len(), "the flood's returns are due; this one is booked")
	assert.LessOrEqual(t, told.Cap(), 64, "and the flood's list is gone")
}

func TestHoldTimeWarming(t *testing.T) {
	var h core.HoldTime
	for range 15 {
		h.Observe(int64(time.Second))
	}
	assert.True(t, h.Warming(), "every release feeds it at first")
	h.Observe(int64(time.Second))
	assert.False(t, h.Warming(), "then a sample of them")
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
	told := new(core.Told)
	assert.Equal(t, core.MaxRetryAfter, h.RetryAfter(0, 1, 1<<40+1, 1, nil, 0, told), "no overflow, capped")

	// A flood of refusals (a caller that asks again at once) pushes the
	// returns told back by at most eight rounds of the slots.
	var e core.HoldTime
	e.Observe(int64(time.Second))
	told = new(core.Told)
	for range 2000 {
		e.RetryAfter(0, 1, 1, 2, nil, 0, told)
	}
	assert.Equal(t, 8500*time.Millisecond, e.RetryAfter(0, 1, 1, 2, nil, 0, told), "8 rounds of 2 slots of 1 s, and one more turn")
	assert.Equal(t, 4*time.Second, e.RetryAfter(int64(5*time.Second), 1, 1, 2, nil, 0, told), "those due before 5 s gone: 7 returns ahead")
}

// Of more holders than the limit (a limit lowered under them), all those
// that must end before there is room count: the youngest's end frees it.
func TestRetryAfterFromStarts(t *testing.T) {
	sec := int64(time.Second)
	var h core.HoldTime
	h.Observe(10 * sec)
	starts := []core.End{{At: 0, Units: 1}, {At: 1 * sec, Units: 1}, {At: 2 * sec, Units: 1}, {At: 3 * sec, Units: 1}}
	assert.Equal(t, 3*time.Second, h.RetryAfter(10*sec, 1, 4, 1, starts, 0, nil), "the youngest of 4 holders under a limit of 1 frees the slot, at 13 s")
	assert.Equal(t, 500*time.Millisecond, h.RetryAfter(10*sec, 1, 4, 1, starts, 2500*time.Millisecond, nil), "with a lead")
}

// An unlimited lane (a Gate that only paces) has turns of no length and
// books without overflow.
func TestRetryAfterUnlimited(t *testing.T) {
	var h core.HoldTime
	h.Observe(int64(30 * time.Second))
	told := new(core.Told)
	for range 3 {
		assert.Equal(t, time.Millisecond, h.RetryAfter(0, 1, 6, math.MaxInt, nil, 0, told))
	}
}

// A weighted caller waits for units, not for a holder: a holder's end frees
// all it holds at once, and the returns told count what they need.
func TestRetryAfterUnits(t *testing.T) {
	sec := int64(time.Second)
	var h core.HoldTime
	h.Observe(sec)
	one60 := []core.End{{At: 10 * sec, Units: 60}}
	assert.Equal(t, time.Second, h.RetryAfter(10*sec, 50, 50-40, 100, one60, 0, nil), "50 units beside a holder of 60 under 100: when it ends")

	one100 := []core.End{{At: 10 * sec, Units: 100}}
	assert.Equal(t, time.Second, h.RetryAfter(10*sec, 1, 99+1, 100, one100, 0, nil), "the 100th one-unit caller behind a holder of 100: when it ends")
	assert.Equal(t, 2*time.Second, h.RetryAfter(10*sec, 1, 100+1, 100, one100, 0, nil), "the 101st: a round later")

	mixed := []core.End{{At: 5 * sec, Units: 70}, {At: 0, Units: 30}}
	var m core.HoldTime
	m.Observe(10 * sec)
	assert.Equal(t, 4*time.Second, m.RetryAfter(6*sec, 20, 20, 100, mixed, 0, nil), "20 units: the older holder's 30 free at 10 s")
	assert.Equal(t, 9*time.Second, m.RetryAfter(6*sec, 40, 40, 100, mixed, 0, nil), "40 units: the younger's too, at 15 s")

	told := new(core.Told)
	assert.Equal(t, 300*time.Millisecond, h.RetryAfter(0, 30, 30, 100, nil, 0, told), "30 of 100 units a second: 300 ms")
	assert.Equal(t, 600*time.Millisecond, h.RetryAfter(0, 30, 30, 100, nil, 0, told), "behind the 30 told before it")
	assert.Equal(t, 610*time.Millisecond, h.RetryAfter(0, 1, 1, 100, nil, 0, told), "one unit behind the 60 told: 61 units")
}

// One release in sixteen is sampled, spread over the sequence: odd and even
// numbers alike, and every residue of a stride of 16.
func TestSampled(t *testing.T) {
	n, parity, residues := 0, [2]int{}, [16]int{}
	for seq := range uint64(16_000) {
		if core.Sampled(seq) {
			n++
			parity[seq%2]++
			residues[seq%16]++
		}
	}
	assert.InDelta(t, 1000, n, 50, "one in sixteen")
	assert.InDelta(t, parity[0], parity[1], 100, "odd and even alike")
	for r, c := range residues {
		assert.Positive(t, c, "residue %d of 16", r)
	}
}
