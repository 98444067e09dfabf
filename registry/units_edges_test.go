package registry_test

import (
	"context"
	"fmt"
	"sync"
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

// A multi-key waiter m2 (C and B) waits on B behind a heavy waiter H that
// comes first in B's order (its flow's turn); once m (A and B, H's flow)
// is granted through A, H's flow has had its turn and m2 comes first: it
// is granted in the same pass, and that pass holds C's lock while it does
// (a caller on another key of C's shard runs beside it, under -race).
func TestUnitsMultiGrantedWhenAnotherKeysTurnMoves(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](100, registry.WithShards(16))
		keys := map[int]string{} // one key per shard
		for i := 0; len(keys) < 4; i++ {
			k := fmt.Sprint("k", i)
			if _, ok := keys[reg.ShardOf(k)]; !ok {
				keys[reg.ShardOf(k)] = k
			}
		}
		var ks []string
		for _, k := range keys {
			ks = append(ks, k)
		}
		a, b, c := ks[0], ks[1], ks[2]
		d := c + "-beside" // another key, maybe of C's shard
		for i := 0; reg.ShardOf(d) != reg.ShardOf(c); i++ {
			d = fmt.Sprint("d", i)
		}
		reg.SetLimit(a, 1)
		reg.SetLimit(b, 4)
		reg.SetLimit(c, 1)
		heldC, err := reg.TryAcquire(c)
		require.NoError(t, err)
		heldA, err := reg.TryAcquire(a)
		require.NoError(t, err)
		for range 2 {
			_, err := reg.TryAcquire(b) // held to the end
			require.NoError(t, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan string, 3)
		acquire := func(name string, f func() (*slots.Slot, error)) {
			go func() {
				if _, err := f(); err == nil {
					got <- name
				}
			}()
			synctest.Wait()
		}
		acquire("m", func() (*slots.Slot, error) { return reg.AcquireAllN(slots.WithFlow(ctx, "f2"), 1, a, b) })
		acquire("m2", func() (*slots.Slot, error) { return reg.AcquireAllN(slots.WithFlow(ctx, "f3"), 1, c, b) })
		acquire("H", func() (*slots.Slot, error) { return reg.AcquireN(slots.WithFlow(ctx, "f2"), b, 3) })
		require.Equal(t, 3, reg.Waiting(b))

		heldC.Release()
		synctest.Wait()
		assert.Empty(t, got, "H comes before m2 in B's order and cannot take its 3 units")

		var wg sync.WaitGroup
		wg.Go(func() {
			for range 200 {
				if s, err := reg.TryAcquire(d); err == nil {
					s.Release()
				}
			}
		})
		heldA.Release()
		wg.Wait()
		synctest.Wait()
		assert.ElementsMatch(t, []string{"m", "m2"}, []string{<-got, <-got}, "m through A, then m2 through B, whose order it now heads")
		cancel() // H goes
		synctest.Wait()
	})
}

// A caller of several keys passes no blocker on any of them (callers of
// one key do, up to its bound): behind a caller waiting for 5 units of
// "p", with 2 free, an AcquireAll of "p" and "m" waits, and a caller of
// "p" alone that came after it passes both (the AcquireAll may be passed
// at most MaxPassed times, as any).
func TestRegistryAcquireAllPassesNoBlocker(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](10)
		a, err := reg.TryAcquireN("p", 8)
		require.NoError(t, err)
		heavy := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireN(context.Background(), "p", 5)
			assert.NoError(t, err)
			heavy <- s
		}()
		synctest.Wait()
		all := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireAll(context.Background(), "p", "m")
			assert.NoError(t, err)
			all <- s
		}()
		synctest.Wait()
		assert.Equal(t, 2, reg.Waiting("p"), "the AcquireAll waits behind the blocker")
		assert.Equal(t, 0, reg.InFlight("m"))
		one, err := reg.Acquire(context.Background(), "p")
		require.NoError(t, err, "a caller of p alone passes the blocker")
		assert.Equal(t, 9, reg.InFlight("p"))
		one.Release()
		a.Release()
		synctest.Wait()
		(<-heavy).Release()
		(<-all).Release()
		assert.Equal(t, 0, reg.InFlight("p"))
	})
}

// A caller heavier than its key's cap gets no Retry-After in its
// LimitError (coming back cannot help), on a key with holders whose hold
// times are known and on a key of its own, single and several at once.
func TestExceedsLimitNoRetryAfter(t *testing.T) {
	r := registry.New[string](2)
	warm, err := r.TryAcquire("busy")
	require.NoError(t, err)
	warm.Release() // a hold time known
	held, err := r.TryAcquire("busy")
	require.NoError(t, err)
	defer held.Release()
	for _, try := range []func() (*slots.Slot, error){
		func() (*slots.Slot, error) { return r.TryAcquireN("busy", 3) },
		func() (*slots.Slot, error) { return r.TryAcquireN("fresh", 3) },
		func() (*slots.Slot, error) { return r.AcquireN(context.Background(), "busy", 3) },
		func() (*slots.Slot, error) { return r.TryAcquireAllN(3, "busy", "fresh") },
	} {
		_, err := try()
		require.ErrorIs(t, err, slots.ErrExceedsLimit)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Zero(t, le.RetryAfter, "%v", err)
	}
}
