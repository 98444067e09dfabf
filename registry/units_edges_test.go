package registry_test

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// A heavy single-key waiter left out by a unit an urgent AcquireAll keeps
// still keeps its place: a light single-key waiter that came after it does
// not pass it.
func TestUnitsLightDoesNotPassHeavyBesideUrgentMulti(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](10)
		reg.SetLimit("B", 1)
		sB, err := reg.TryAcquire("B")
		require.NoError(t, err)
		x, err := reg.TryAcquireN("A", 3)
		require.NoError(t, err)
		multi := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireAll(context.Background(), "A", "B")
			assert.NoError(t, err)
			multi <- s
		}()
		synctest.Wait()
		for range registry.MaxPassed { // make it urgent: it keeps 1 unit of A
			s, err := reg.TryAcquire("A")
			require.NoError(t, err)
			s.Release()
		}
		heavy := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireN(context.Background(), "A", 7) // 7 free, 1 kept: waits
			assert.NoError(t, err)
			heavy <- s
		}()
		synctest.Wait()
		require.Equal(t, 2, reg.Waiting("A"))
		light := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.Acquire(context.Background(), "A")
			assert.NoError(t, err)
			light <- s
		}()
		synctest.Wait()
		select {
		case s := <-light:
			t.Errorf("the light caller that came after the heavy waiter was served first (A: %d of 10 held, %d waiting)", reg.InFlight("A"), reg.Waiting("A"))
			s.Release()
		default:
			x.Release()
			synctest.Wait()
			(<-light).Release()
		}
		x.Release()
		sB.Release()
		synctest.Wait()
		(<-multi).Release()
		synctest.Wait()
		(<-heavy).Release()
		assert.Equal(t, 0, reg.Keys())
	})
}

// An AcquireAllN refused while waiting, by a lower limit on another key
// than the one it was full on, names the key that refused it.
func TestUnitsRefusedMultiNamesRefusingKey(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](10)
		a, err := reg.TryAcquireN("A", 10)
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() {
			_, err := reg.AcquireAllN(context.Background(), 5, "A", "B")
			errc <- err
		}()
		synctest.Wait()
		reg.SetLimit("B", 4)
		err = <-errc
		require.ErrorIs(t, err, slots.ErrExceedsLimit)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "B", le.Key, "the key whose limit refused it (%v)", err)
		a.Release()
		assert.Equal(t, 0, reg.Keys())
	})
}

// A registry TryAcquire by the class a reserve is for is admitted beside a
// lower-class heavy waiter.
func TestUnitsRegistryTryAcquireReserveBesideHeavy(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](10, slots.WithShare(slots.PriorityDefault, slots.Share{Reserved: 2}))
		batch := slots.WithPriority(context.Background(), slots.PriorityBatch)
		a, err := reg.AcquireN(batch, "k", 8)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(batch)
		go func() {
			s, err := reg.AcquireN(ctx, "k", 2)
			if err == nil {
				s.Release()
			}
		}()
		synctest.Wait()
		s, err := reg.TryAcquire("k")
		assert.NoError(t, err, "2 units reserved for the default class are free")
		if s != nil {
			s.Release()
		}
		cancel()
		synctest.Wait()
		a.Release()
	})
}

// An AcquireAllN does not pass a heavy single-key waiter that came before
// it on a key (heavyAheadLocked), as a single-key caller in its place
// would not.
func TestUnitsMultiDoesNotPassOlderHeavyWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](6)
		x, err := reg.TryAcquireN("a", 2)
		require.NoError(t, err)
		heavy := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireN(context.Background(), "a", 5) // 4 free: waits
			assert.NoError(t, err)
			heavy <- s
		}()
		synctest.Wait()
		_, err = reg.TryAcquireN("a", 2)
		assert.ErrorIs(t, err, slots.ErrLimitReached, "a single-key caller does not pass the heavy waiter")
		ctx, cancel := context.WithCancel(context.Background())
		var w *slots.Slot
		go func() {
			w, _ = reg.AcquireAllN(ctx, 2, "a", "p")
		}()
		synctest.Wait()
		if w != nil {
			t.Errorf("AcquireAllN(2, a, p) took 2 of the 4 units the older heavy waiter on a keeps (a: %d of 6 held)", reg.InFlight("a"))
			w.Release()
		}
		cancel()
		x.Release()
		synctest.Wait()
		(<-heavy).Release()
		assert.Equal(t, 0, reg.Keys())
	})
}

// A class short of its Min is served on a key beside a heavy waiter of a
// higher class that does not fit; a lower limit that still fits the heavy
// waiter leaves it queued, and the key goes idle after.
func TestUnitsRegistryOwedClassPassesHeavyWaiter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](8,
			slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 2}),
			slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
		hi := slots.WithPriority(context.Background(), slots.PriorityInteractive)
		lo := slots.WithPriority(context.Background(), slots.PriorityBatch)
		h2, err := reg.AcquireN(hi, "p", 2)
		require.NoError(t, err)
		d3, err := reg.AcquireN(context.Background(), "p", 3)
		require.NoError(t, err)
		hctx, hcancel := context.WithCancel(hi)
		heavy := make(chan error, 1)
		go func() {
			s, err := reg.AcquireN(hctx, "p", 4)
			if err == nil {
				s.Release()
			}
			heavy <- err
		}()
		synctest.Wait()
		b, err := reg.AcquireN(lo, "p", 1)
		require.NoError(t, err, "batch is owed its Min: served beside the heavy waiter")
		reg.SetLimit("p", 6)
		synctest.Wait()
		assert.Equal(t, 1, reg.Waiting("p"), "4 units still fit a limit of 6: it waits on")
		hcancel()
		assert.ErrorIs(t, <-heavy, context.Canceled)
		b.Release()
		h2.Release()
		d3.Release()
		reg.ClearLimit("p")
		assert.Equal(t, 0, reg.Keys())
	})
}
