package registry

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

// passOver lets times newcomers take key and give it back, each passing
// over the AcquireAll waiting on it.
func passOver(t *testing.T, reg *Registry[string], key string, times int) {
	t.Helper()
	for i := range times {
		s, err := reg.TryAcquire(key)
		require.NoError(t, err, "pass %d", i+1)
		s.Release()
	}
}

// A newcomer that nothing holds back is admitted on a key with room, even
// while callers held back for a passed-over AcquireAll queue there.
func TestHigherClassNewcomerBesideHeldBackWaiters(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := New[string](2)
		reg.SetLimit("b", 1)
		hb, err := reg.TryAcquire("b")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _, _ = reg.AcquireAll(ctx, "a", "b") }()
		synctest.Wait()
		passOver(t, reg, "a", MaxPassed)
		got := make(chan error, 2)
		for _, prio := range []slots.Priority{slots.PriorityDefault, slots.PriorityInteractive} {
			go func() {
				s, err := reg.Acquire(slots.WithPriority(ctx, prio), "a")
				if err == nil {
					s.Release()
				}
				got <- err
			}()
			synctest.Wait()
		}
		assert.Equal(t, "", reg.servableWaiter(), "no waiter is left queued while it could be served")
		require.Len(t, got, 2, "a has two free slots, one kept: both newcomers go through")
		assert.NoError(t, <-got)
		assert.NoError(t, <-got)
		cancel()
		synctest.Wait()
		hb.Release()
		assert.Zero(t, reg.Keys())
	})
}

// A passed-over AcquireAll keeps one slot of a shared key, not all of them:
// a provider key with room keeps serving the other models while the
// waiter's model is held by a long stream; while its model is disabled
// (limit 0) it keeps none, since it cannot be served (it kept one before;
// see TestPausedKeysWaitersKeepNothing).
func TestPassedOverWaiterKeepsOneSlotOfASharedKey(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		testrig.Bubble(t, func(t *testing.T) {
			reg := New[string](10)
			reg.SetLimit("model-1", 1)
			if disabled {
				reg.SetLimit("model-1", 0)
			}
			var stream *slots.Slot
			if !disabled {
				var err error
				stream, err = reg.TryAcquire("model-1")
				require.NoError(t, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _, _ = reg.AcquireAll(ctx, "provider", "model-1") }()
			synctest.Wait()
			for i := range MaxPassed {
				s, err := reg.TryAcquireAll("provider", "model-2")
				require.NoError(t, err, "pass %d", i+1)
				s.Release()
			}
			var held []*slots.Slot
			for i := range 9 {
				s, err := reg.TryAcquireAll("provider", "model-2")
				require.NoError(t, err, "provider slot %d of the 9 not kept", i+1)
				held = append(held, s)
			}
			tenth, err := reg.TryAcquire("provider")
			if disabled {
				require.NoError(t, err, "nothing kept for a waiter whose model is disabled")
				held = append(held, tenth)
			} else {
				assert.ErrorIs(t, err, slots.ErrLimitReached, "the tenth is kept for the waiter")
			}
			for _, s := range held {
				s.Release()
			}
			cancel()
			synctest.Wait()
			if stream != nil {
				stream.Release()
			}
			assert.Zero(t, reg.Keys())
		})
	}
}

// A class with a Min share gets no bypass of the bound: the slots its
// share owes it go to its own passed-over AcquireAll first.
func TestShareMinDoesNotStarveAcquireAll(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := New[string](1, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
		batch := slots.WithPriority(context.Background(), slots.PriorityBatch)
		a, err := reg.Acquire(batch, "a")
		require.NoError(t, err)
		b, err := reg.Acquire(batch, "b")
		require.NoError(t, err)
		got := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireAll(batch, "a", "b")
			assert.NoError(t, err)
			got <- s
		}()
		synctest.Wait()
		try := func(key string) (*slots.Slot, error) {
			ctx, stop := context.WithTimeout(batch, time.Millisecond)
			defer stop()
			return reg.Acquire(ctx, key)
		}
		passes := 0
		for range 10 * MaxPassed {
			a.Release()
			if a, err = try("a"); err != nil {
				break
			}
			passes++
			b.Release()
			if b, err = try("b"); err != nil {
				break
			}
			passes++
		}
		assert.LessOrEqual(t, passes, MaxPassed)
		if a != nil {
			a.Release()
		}
		if b != nil {
			b.Release()
		}
		synctest.Wait()
		(<-got).Release()
		assert.Zero(t, reg.Keys())
	})
}
