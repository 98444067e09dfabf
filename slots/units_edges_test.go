package slots_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// With leak detection, Slot.Units reports the slot's units.
func TestUnitsLeakDetectionUnits(t *testing.T) {
	l := slots.NewLimiter(10, slots.WithLeakDetection())
	s, err := l.TryAcquireN(4)
	require.NoError(t, err)
	assert.Equal(t, 4, l.InFlight())
	assert.Equal(t, 4, s.Units(), "Slot.Units with leak detection")
	s.Release()
}

// Without shares, a higher-class newcomer beside a lower-class heavy
// waiter that does not fit is served at once.
func TestUnitsHigherNewcomerBesideHeavyWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10)
		a, err := l.TryAcquireN(5)
		require.NoError(t, err)
		go func() {
			s, err := l.AcquireN(slots.WithPriority(context.Background(), slots.PriorityBatch), 8)
			if err == nil {
				s.Release()
			}
		}()
		synctest.Wait()
		require.Equal(t, 1, l.Waiting())
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		start := time.Now()
		s, err := l.Acquire(slots.WithPriority(ctx, slots.PriorityInteractive))
		assert.NoError(t, err)
		t.Logf("interactive caller waited %v (err %v), with %d units free", time.Since(start), err, 10-5)
		if s != nil {
			s.Release()
		}
		a.Release()
		synctest.Wait()
	})
}

// A lowered limit never refuses a weight-1 waiter, also when the lane has
// a heavy waiter and the class's Capacity drops to 0.
func TestUnitsLightWaiterNeverRefused(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(4, slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 2}))
		hold, err := l.AcquireN(context.Background(), 2) // default class, 2 of the 2 it may take
		require.NoError(t, err)
		light := make(chan error, 1)
		go func() {
			s, err := l.Acquire(context.Background())
			if err == nil {
				s.Release()
			}
			light <- err
		}()
		heavy := make(chan error, 1)
		go func() {
			s, err := l.AcquireN(context.Background(), 2)
			if err == nil {
				s.Release()
			}
			heavy <- err
		}()
		synctest.Wait()
		require.Equal(t, 2, l.Waiting())
		l.SetLimit(2) // Capacity(default) = 2 - 2 = 0
		synctest.Wait()
		select {
		case err := <-light:
			t.Errorf("weight-1 waiter ended with %v; TooHeavy never refuses n == 1", err)
		default:
		}
		assert.ErrorIs(t, <-heavy, slots.ErrExceedsLimit)
		hold.Release()
		l.SetLimit(4)
		synctest.Wait()
	})
}

// With shares, a TryAcquire of the class the reserve is for is admitted
// while a lower-class heavy waiter waits: the reserve is free.
func TestUnitsTryAcquireReserveBesideHeavy(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10, slots.WithShare(slots.PriorityDefault, slots.Share{Reserved: 2}))
		batch := slots.WithPriority(context.Background(), slots.PriorityBatch)
		a, err := l.AcquireN(batch, 8)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(batch)
		go func() {
			s, err := l.AcquireN(ctx, 2)
			if err == nil {
				s.Release()
			}
		}()
		synctest.Wait()
		require.Equal(t, 1, l.Waiting())
		s, err := l.TryAcquire()
		assert.NoError(t, err, "2 units reserved for the default class are free")
		if s != nil {
			s.Release()
		}
		cancel()
		synctest.Wait()
		a.Release()
	})
}

// A short class with a heavy request does not take a lower class's
// Reserved beyond its own shortfall: Default Min 2, Batch Reserved 4,
// limit 10.
func TestUnitsShortClassLeavesLowerReserve(t *testing.T) {
	l := slots.NewLimiter(10,
		slots.WithShare(slots.PriorityDefault, slots.Share{Min: 2}),
		slots.WithShare(slots.PriorityBatch, slots.Share{Reserved: 4}))
	// One unit at a time, the default class stops at 6.
	var held []*slots.Slot
	for {
		s, err := l.TryAcquire()
		if err != nil {
			break
		}
		held = append(held, s)
	}
	t.Logf("weight-1 default admissions: %d", len(held))
	for _, s := range held {
		s.Release()
	}
	s, err := l.TryAcquireN(10)
	if err == nil {
		t.Errorf("one default admission of 10 units took batch's 4 reserved units (weight-1 callers get %d)", len(held))
		s.Release()
	}
}

// A default heavy waiter kept out only by interactive's Reserved, once
// passed by its bound, keeps its place: batch, owed nothing, does
// not take the units it needs.
func TestUnitsBatchDoesNotPassHeavyDefault(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10, slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 2}))
		batch := slots.WithPriority(context.Background(), slots.PriorityBatch)
		x, err := l.AcquireN(context.Background(), 1)
		require.NoError(t, err)
		heavy := make(chan *slots.Slot, 1)
		go func() {
			s, err := l.AcquireN(context.Background(), 8) // Capacity(default) = 8
			assert.NoError(t, err)
			heavy <- s
		}()
		synctest.Wait()
		passUnits(t, l, batch, 8/2) // another flow takes half its units: it keeps its place from then on
		light := make(chan *slots.Slot, 1)
		go func() {
			s, err := l.AcquireN(batch, 1)
			assert.NoError(t, err)
			light <- s
		}()
		synctest.Wait()
		assert.Equal(t, 2, l.Waiting(), "batch waits behind the heavy default waiter, 7 units free")
		x.Release()
		s := <-heavy
		synctest.Wait()
		assert.Equal(t, 8, l.InFlight())
		assert.Equal(t, 1, l.Waiting(), "the last 2 units are interactive's reserve")
		s.Release()
		(<-light).Release()
		assert.Equal(t, 0, l.InFlight())
	})
}

// A class short of its Min is served beside a heavy waiter of a higher
// class that does not fit, and a lower limit that still fits the heavy
// waiter leaves it queued.
func TestUnitsOwedClassPassesHeavyWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(8, slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 2}),
			slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
		hi := slots.WithPriority(context.Background(), slots.PriorityInteractive)
		lo := slots.WithPriority(context.Background(), slots.PriorityBatch)
		h2, err := l.AcquireN(hi, 2)
		require.NoError(t, err)
		d3, err := l.AcquireN(context.Background(), 3)
		require.NoError(t, err)
		hctx, hcancel := context.WithCancel(hi)
		heavy := make(chan error, 1)
		go func() {
			s, err := l.AcquireN(hctx, 4) // 3 free: waits
			if err == nil {
				s.Release()
			}
			heavy <- err
		}()
		synctest.Wait()
		b, err := l.AcquireN(lo, 1)
		require.NoError(t, err, "batch is owed its Min: served beside the heavy waiter")
		assert.Equal(t, 1, l.Waiting())
		l.SetLimit(6)
		synctest.Wait()
		assert.Equal(t, 1, l.Waiting(), "4 units still fit a limit of 6: it waits on")
		hcancel()
		assert.ErrorIs(t, <-heavy, context.Canceled)
		b.Release()
		h2.Release()
		d3.Release()
		assert.Equal(t, 0, l.InFlight())
	})
}

// A heavy default waiter that does not fit does not keep batch from the
// units batch's Min owes it: 3 units free, batch holds 0 of Min 2, and the
// batch waiter is served.
func TestUnitsHeavyLeavesLowerMin(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 2}))
		x, err := l.AcquireN(context.Background(), 7)
		require.NoError(t, err)
		hctx, hcancel := context.WithCancel(context.Background())
		go func() {
			if s, err := l.AcquireN(hctx, 9); err == nil {
				s.Release()
			}
		}()
		synctest.Wait()
		low := make(chan *slots.Slot, 1)
		go func() {
			s, _ := l.AcquireN(slots.WithPriority(context.Background(), slots.PriorityBatch), 1)
			low <- s
		}()
		synctest.Wait()
		select {
		case s := <-low:
			s.Release()
		default:
			t.Errorf("batch (0 held, Min 2) not served with 3 units free: a heavy default waiter keeps them")
			hcancel()
			synctest.Wait()
			(<-low).Release()
		}
		hcancel()
		x.Release()
		synctest.Wait()
	})
}

// A caller that could be served at once beside a heavy waiter is served,
// not refused by the queue's bound (WithMaxQueue), and one that could not
// is refused without being counted as waiting.
func TestUnitsQueueBoundBesideHeavyWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10, slots.WithMaxQueue(1))
		a, err := l.TryAcquireN(5)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		heavy := make(chan error, 1)
		go func() {
			_, err := l.AcquireN(slots.WithPriority(ctx, slots.PriorityBatch), 8)
			heavy <- err
		}()
		synctest.Wait()
		require.Equal(t, 1, l.Waiting())
		s, err := l.Acquire(slots.WithPriority(context.Background(), slots.PriorityInteractive))
		require.NoError(t, err, "5 of 10 units free, and a higher class than the heavy waiter")
		_, err = l.AcquireN(slots.WithPriority(context.Background(), slots.PriorityInteractive), 5)
		assert.ErrorIs(t, err, slots.ErrQueueFull, "4 free: it would wait, and the queue is full")
		assert.Equal(t, 1, l.Waiting())
		assert.Equal(t, uint64(1), l.Stats().QueueFull)
		cancel()
		assert.ErrorIs(t, <-heavy, context.Canceled)
		s.Release()
		a.Release()
		assert.Equal(t, 0, l.InFlight())
	})
}
