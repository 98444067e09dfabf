package core_test

import (
	"context"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
)

type owner struct{ released, misused atomic.Int32 }

func (o *owner) Release(*core.Hold) bool { o.released.Add(1); return true }
func (o *owner) Misuse(*core.Hold)       { o.misused.Add(1) }
func (o *owner) Time(int64) time.Time    { return time.Time{} }
func (o *owner) Log() *slog.Logger       { return slog.Default() }

func TestHoldReleasesOnce(t *testing.T) {
	o := &owner{}
	h := &core.Hold{Owner: o}
	assert.True(t, h.Release())
	assert.False(t, h.Release())
	assert.True(t, h.Released())
	assert.Equal(t, int32(1), o.released.Load())
	assert.Equal(t, int32(1), o.misused.Load())
}

func TestAwait(t *testing.T) {
	withdrawn := func(w *core.Waiter) bool { w.State = core.Gone; return true }
	granted := func(*core.Waiter) bool { return false }

	t.Run("granted", func(t *testing.T) {
		w := core.NewWaiter(&core.Hold{Owner: &owner{}}, 0)
		grant(w)
		assert.Equal(t, core.OutGranted, core.Await(context.Background(), w, nil, withdrawn))
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		w := core.NewWaiter(&core.Hold{Owner: &owner{}}, 0)
		assert.Equal(t, core.OutCanceled, core.Await(ctx, w, nil, withdrawn))
		assert.Equal(t, core.Gone, w.State)
	})
	t.Run("a grant that races cancellation is given back", func(t *testing.T) {
		o := &owner{}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		w := core.NewWaiter(&core.Hold{Owner: o}, 0)
		grant(w)
		// Whichever case select picks, the caller leaves with nothing.
		assert.Equal(t, core.OutCanceled, core.Await(ctx, w, nil, granted))
		assert.Equal(t, int32(1), o.released.Load())
	})
	t.Run("expired, and a grant that races expiry is kept", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			w := core.NewWaiter(&core.Hold{Owner: &owner{}}, 0)
			assert.Equal(t, core.OutExpired, core.Await(context.Background(), w, time.After(time.Second), withdrawn))

			o := &owner{}
			w = core.NewWaiter(&core.Hold{Owner: o}, 0)
			expire := make(chan time.Time, 1)
			expire <- time.Now()
			grantOnWithdraw := func(w *core.Waiter) bool { grant(w); return false }
			assert.Equal(t, core.OutGranted, core.Await(context.Background(), w, expire, grantOnWithdraw))
			assert.Equal(t, int32(0), o.released.Load())
		})
	})
}

// TestAwaitEndedContextWins: when the context has ended, the caller leaves
// with nothing, even if the max wait fired or a grant landed at the same time.
func TestAwaitEndedContextWins(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fired := func() <-chan time.Time {
		c := make(chan time.Time, 1)
		c <- time.Time{}
		return c
	}
	for range 100 { // select picks among ready cases at random
		o := &owner{}
		w := core.NewWaiter(&core.Hold{Owner: o}, 0)
		grant(w)
		assert.Equal(t, core.OutCanceled, core.Await(ctx, w, fired(), func(*core.Waiter) bool { return false }))
		assert.Equal(t, int32(1), o.released.Load(), "the grant is given back")

		w = core.NewWaiter(&core.Hold{Owner: &owner{}}, 0)
		assert.Equal(t, core.OutCanceled, core.Await(ctx, w, fired(), func(w *core.Waiter) bool { w.State = core.Gone; return true }),
			"not OutExpired: fail-open must not hand a bypassed slot to a caller whose context ended")
	}
}

func grant(w *core.Waiter) {
	var wk core.Wakes
	wk.Grant(w)
	wk.Wake()
}

func TestWakesManyAtOnce(t *testing.T) {
	var wk core.Wakes
	ws := make([]*core.Waiter, 9)
	for i := range ws {
		ws[i] = core.NewWaiter(&core.Hold{Owner: &owner{}}, 0)
		wk.Grant(ws[i])
		assert.Equal(t, core.Granted, ws[i].State)
	}
	wk.Wake()
	for _, w := range ws {
		assert.Equal(t, core.OutGranted, core.Await(context.Background(), w, nil, nil))
	}
}

func TestAwaitWithNothingElseToEndIt(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		w := core.NewWaiter(&core.Hold{Owner: &owner{}}, 0)
		out := make(chan core.Outcome)
		go func() { out <- core.Await(context.Background(), w, nil, nil) }()
		synctest.Wait() // the waiter is durably blocked in the bubble
		var wk core.Wakes
		wk.Grant(w)
		wk.Wake()
		assert.Equal(t, core.OutGranted, <-out)
	})
}

func TestHolderSetRefusesStrangers(t *testing.T) {
	var set core.HolderSet
	a, b := &core.Hold{}, &core.Hold{}
	set.Add(a, &a.Idx)
	set.Add(b, &b.Idx)
	copied := &core.Hold{Idx: a.Idx} // what a copy of a's Slot would carry
	assert.False(t, set.Remove(copied, &copied.Idx), "a copy is not a holder")
	assert.False(t, set.Remove(copied, &a.Idx), "not even with the original's index")
	assert.Equal(t, 2, set.Len())
	assert.True(t, set.Remove(a, &a.Idx))
	assert.False(t, set.Remove(a, &a.Idx), "twice")
	assert.Same(t, b, set.At(0))
	assert.Equal(t, int32(0), b.Idx, "the moved holder learns its new place")
}

// TestHolderSetAgainstModel adds and removes holders at random and checks
// that every holder's index points at its own record.
func TestHolderSetAgainstModel(t *testing.T) {
	var set core.HolderSet
	live := map[*core.Hold]bool{}
	var order []*core.Hold
	for step := range 5000 {
		if len(order) > 0 && (step%3 == 0 || len(order) > 80) {
			i := (step * 7919) % len(order)
			h := order[i]
			order = append(order[:i], order[i+1:]...)
			delete(live, h)
			if !assert.True(t, set.Remove(h, &h.Idx), "step %d", step) {
				return
			}
		} else {
			h := &core.Hold{}
			set.Add(h, &h.Idx)
			live[h] = true
			order = append(order, h)
		}
		if !assert.Equal(t, len(live), set.Len()) {
			return
		}
		for i := range set.Len() {
			h := set.At(i)
			if !assert.True(t, live[h]) || !assert.Equal(t, int32(i), h.Idx, "step %d", step) {
				return
			}
		}
	}
}

// TestTrackedRefusesACopy: with leak detection, Release through a copy of
// the stand-in (what a copied Slot carries) frees nothing.
func TestTrackedRefusesACopy(t *testing.T) {
	o := &owner{}
	type slot struct{ h core.Hold }
	s := &slot{}
	tr := &core.Tracked{Hold: core.Hold{Owner: o}}
	core.AttachTo(tr, s, &s.h)
	copied := &core.Hold{Owner: s.h.Owner} // another Hold with the same owner
	assert.False(t, copied.Release(), "the copy reports that it freed nothing")
	assert.Equal(t, int32(0), o.released.Load(), "and nothing is freed")
	assert.Equal(t, int32(1), o.misused.Load())
	assert.True(t, s.h.Release())
	assert.Equal(t, int32(1), o.released.Load())
	runtime.KeepAlive(s)
}

// A dropped stand-in's reclaim calls the Tracked's First, which frees the
// hold with the rest of the reclaim: also when First panics after it has
// arranged for it (the panic is logged, not the end of the process, and
// the capacity is not lost).
func TestReclaimCallsFirstThenFrees(t *testing.T) {
	for _, panics := range []bool{false, true} {
		o := &owner{}
		tr := &core.Tracked{Hold: core.Hold{Owner: o}}
		var called atomic.Bool
		first := func(rest func()) {
			defer rest()
			called.Store(true)
			if panics {
				panic("a first call's bug")
			}
		}
		tr.First.Store(&first)
		func() {
			type slot struct{ h core.Hold }
			core.AttachTo(tr, &slot{}, new(core.Hold))
		}()
		require.Eventually(t, func() bool { runtime.GC(); return o.released.Load() == 1 }, 10*time.Second, time.Millisecond, "panics: %v", panics)
		assert.True(t, called.Load())
	}
}

// A Hold is the whole of a Slot's allocation: 48 bytes, a size class of
// its own. A field that pushes it to 56 makes every admission allocate 64.
func TestHoldSize(t *testing.T) {
	assert.Equal(t, uintptr(48), unsafe.Sizeof(core.Hold{}))
	assert.Equal(t, uintptr(48), unsafe.Sizeof(core.Handle{}))
}
