package pacing_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

func ready(c chan result) (result, bool) {
	select {
	case r := <-c:
		return r, true
	default:
		return result{}, false
	}
}

// passTokens makes requests for model, of 2 tokens each and in the
// default flow, pass the waiter that cannot take its tokens until n have,
// each starting and ending at once: past its bound (core.PassFactor times
// its tokens) that waiter keeps its place.
func passTokens(t *testing.T, g *pacing.Gate, model string, n int) {
	t.Helper()
	for range n / 2 {
		gt, err := g.AcquireN(context.Background(), model, 2)
		require.NoError(t, err)
		gt.Slot.Release()
	}
}

// A heavy waiter that stops the pass on the provider's tokens (its bound
// has passed it) withdraws (its context ends): the light waiter it
// held back now fits and is granted at once (withdraw dispatched only with
// shares once).
func TestTokensBlockerThatLeavesServesTheRest(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 10, MaxQueueWaitMS: 60_000})
		ctx := context.Background()
		a, err := g.AcquireN(ctx, "m", 5)
		require.NoError(t, err)
		hctx, cancelH := context.WithCancel(ctx)
		heavy := acquireNAsync(hctx, g, "m", 8)
		synctest.Wait()
		passTokens(t, g, "n", 8*core.PassFactor)
		light := acquireNAsync(ctx, g, "n", 2)
		synctest.Wait()
		require.Equal(t, 2, g.Status().Queued)

		cancelH()
		synctest.Wait()
		h := <-heavy
		require.ErrorIs(t, h.err, context.Canceled)
		st := g.Status()
		t.Logf("after the heavy one left: Tokens=%d TokenLimit=%d Queued=%d", st.Tokens, st.TokenLimit, st.Queued)
		l, ok := ready(light)
		if !assert.True(t, ok, "5 of 10 tokens held, the light waiter (2) fits, nobody ahead of it: it should be granted") {
			time.Sleep(61 * time.Second)
			synctest.Wait()
			l = <-light
			var le *slots.LimitError
			if errors.As(l.err, &le) {
				t.Logf("the light waiter ended with %v: Cap=%q InFlight=%d Limit=%d", l.err, le.Cap, le.InFlight, le.Limit)
			}
		} else if l.err == nil {
			l.g.Slot.Release()
		}
		a.Slot.Release()
	})
}

// The same with the model's tokens.
func TestTokensModelBlockerThatLeavesServesTheRest(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxQueueWaitMS: 60_000, Models: map[string]pacing.ModelConfig{"big": {MaxInflightTokens: 10}}})
		ctx := context.Background()
		a, err := g.AcquireN(ctx, "big", 5)
		require.NoError(t, err)
		hctx, cancelH := context.WithCancel(ctx)
		heavy := acquireNAsync(hctx, g, "big", 8)
		synctest.Wait()
		passTokens(t, g, "big", 8*core.PassFactor)
		light := acquireNAsync(ctx, g, "big", 2)
		synctest.Wait()
		require.Equal(t, 2, g.Status().Queued)
		cancelH()
		synctest.Wait()
		<-heavy
		l, ok := ready(light)
		assert.True(t, ok, "the model's light waiter fits after the heavy one left")
		if !ok {
			time.Sleep(61 * time.Second)
			synctest.Wait()
			l = <-light
			t.Logf("the light waiter ended with %v", l.err)
		} else if l.err == nil {
			l.g.Slot.Release()
		}
		a.Slot.Release()
	})
}

// A heavy interactive newcomer stops the pass before a default-class
// waiter whose model is not due yet, so the pass arms no timer for it; the
// newcomer is then turned away (queue full), and the dispatch after it
// arms the timer again: the waiter starts when its model is due.
func TestTokensTurnedAwayNewcomerKeepsStartTimer(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 10, MaxQueue: 1, MaxQueueWaitMS: 60_000,
			Models: map[string]pacing.ModelConfig{"slow": {MinIntervalMS: 1000}}})
		ctx := context.Background()
		s0, err := g.Acquire(ctx, "slow")
		require.NoError(t, err)
		s0.Slot.Release()
		a, err := g.AcquireN(ctx, "x", 5)
		require.NoError(t, err)
		w := acquireAsync(ctx, g, "slow")
		synctest.Wait()
		require.Equal(t, 1, g.Status().Queued)

		_, err = g.AcquireN(slots.WithPriority(ctx, slots.PriorityInteractive), "x", 8)
		require.ErrorIs(t, err, slots.ErrQueueFull)

		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		r, ok := ready(w)
		assert.True(t, ok, "the slow model was due 0.5 s ago and nothing else holds the waiter back")
		if !ok {
			time.Sleep(60 * time.Second)
			synctest.Wait()
			r = <-w
			t.Logf("the waiter ended with %v", r.err)
		} else if r.err == nil {
			r.g.Slot.Release()
		}
		a.Slot.Release()
	})
}

// A waiter refused by Reconfigure keeps a pointer to its model's lane; if
// the lane is dropped and a new one made under the same name before the
// refused caller takes the lock again, the caller leaves the new lane (and
// its cap, while a request holds it) alone.
func TestTokensRefusedWaiterLeavesANewLaneAlone(t *testing.T) {
	prev := runtime.GOMAXPROCS(1) // the refused caller runs when the test blocks
	defer runtime.GOMAXPROCS(prev)
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxInflightTokens: 100,
			Models: map[string]pacing.ModelConfig{"M": {MaxConcurrentRequests: 1}}})
		ctx := context.Background()
		h1, err := g.Acquire(ctx, "other")
		require.NoError(t, err)
		w := acquireNAsync(ctx, g, "M", 80)
		synctest.Wait()
		require.Equal(t, 1, g.Status().Queued)

		// M unconfigured, the provider's tokens lowered below the waiter.
		require.NoError(t, g.Reconfigure(pacing.Config{MaxConcurrentRequests: 1, MaxInflightTokens: 50}))
		// Before the refused caller runs: a too-heavy request for M drops
		// M's idle lane, and M comes back configured (a new lane).
		_, err = g.AcquireN(ctx, "M", 60)
		require.ErrorIs(t, err, slots.ErrExceedsLimit)
		require.NoError(t, g.Reconfigure(pacing.Config{MaxInflightTokens: 50,
			Models: map[string]pacing.ModelConfig{"M": {MaxConcurrentRequests: 1}}}))
		m1, err := g.Acquire(ctx, "M")
		require.NoError(t, err)
		require.Equal(t, 1, g.Status().ByModel["M"])

		r := <-w // the refused caller runs now
		require.ErrorIs(t, r.err, slots.ErrExceedsLimit)
		st := g.Status()
		assert.Equal(t, 1, st.ByModel["M"], "M's request still holds its slot: ByModel=%v TokensByModel=%v", st.ByModel, st.TokensByModel)

		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		m2, err := g.Acquire(tctx, "M")
		if assert.Error(t, err, "M's cap is 1 and M's first request holds it: the second must wait") {
			t.Logf("second: %v", err)
		} else {
			t.Logf("second request for M granted at once; Status.ByModel=%v", g.Status().ByModel)
			m2.Slot.Release()
		}
		m1.Slot.Release()
		h1.Slot.Release()
	})
}

// Close, then a Reconfigure lowering a token cap before the waiters have
// seen the close: they end with ErrGateClosed, as Close documents.
func TestTokensClosedGateRefusesAsClosed(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 100})
		ctx := context.Background()
		a, err := g.AcquireN(ctx, "m", 60)
		require.NoError(t, err)
		w := acquireNAsync(ctx, g, "m", 90)
		synctest.Wait()
		g.Close()
		require.NoError(t, g.Reconfigure(pacing.Config{MaxInflightTokens: 80}))
		r := <-w
		assert.ErrorIs(t, r.err, pacing.ErrGateClosed, "got %v", r.err)
		a.Slot.Release()
	})
}

// A refusal whose cap was raised again before the caller relocked names
// the cap as it was when it refused.
func TestTokensRefusalNamesTheCapAsItWas(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 100})
		ctx := context.Background()
		a, err := g.AcquireN(ctx, "m", 60)
		require.NoError(t, err)
		w := acquireNAsync(ctx, g, "m", 90)
		synctest.Wait()
		require.NoError(t, g.Reconfigure(pacing.Config{MaxInflightTokens: 80}))
		require.NoError(t, g.Reconfigure(pacing.Config{MaxInflightTokens: 100}))
		r := <-w
		require.ErrorIs(t, r.err, slots.ErrExceedsLimit)
		var le *slots.LimitError
		require.ErrorAs(t, r.err, &le)
		t.Logf("refusal: %v (Cap=%q InFlight=%d Limit=%d)", r.err, le.Cap, le.InFlight, le.Limit)
		assert.Equal(t, pacing.CapTokens, le.Cap)
		assert.Equal(t, 80, le.Limit)
		a.Slot.Release()
	})
}

// The wait timeout of a request held back by a heavy one ahead that keeps
// its place (its own tokens fit) names the token cap it waited behind.
func TestTokensTimeoutBehindHeavyNamesTokens(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := pacing.Config{MaxInflightTokens: 100, MaxQueueWaitMS: 5000}
		g := newGate(t, cfg)
		ctx := context.Background()
		a, err := g.AcquireN(ctx, "m", 60)
		require.NoError(t, err)
		heavy := acquireNAsync(ctx, g, "m", 50) // waits up to 5 s
		synctest.Wait()
		passTokens(t, g, "n", 50*core.PassFactor) // it keeps its place from then on
		cfg.MaxQueueWaitMS = 1000
		require.NoError(t, g.Reconfigure(cfg))
		light := acquireNAsync(ctx, g, "n", 30) // up to 1 s, behind the heavy one
		time.Sleep(1500 * time.Millisecond)
		l := <-light
		var le *slots.LimitError
		require.ErrorAs(t, l.err, &le)
		assert.ErrorIs(t, l.err, slots.ErrWaitTimeout)
		assert.Equal(t, pacing.CapTokens, le.Cap)
		assert.Equal(t, 60, le.InFlight)
		assert.Equal(t, 100, le.Limit)
		a.Slot.Release()
		h := <-heavy
		require.NoError(t, h.err)
		h.g.Slot.Release()
	})
}

// A too-heavy refusal answers no Retry-After and tells no return, so the
// Retry-After of the next queue-full refusal is what it would be without
// it.
func TestTokensTooHeavyTellsNoReturn(t *testing.T) {
	run := func(heavies int) time.Duration {
		var ra time.Duration
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxInflightTokens: 10, MaxQueueWaitMS: 60_000})
			ctx := context.Background()
			a, err := g.Acquire(ctx, "m")
			require.NoError(t, err)
			wctx, cancel := context.WithCancel(ctx)
			w := acquireAsync(wctx, g, "m")
			synctest.Wait()
			for range heavies {
				_, err := g.AcquireN(ctx, "m", 11)
				require.ErrorIs(t, err, slots.ErrExceedsLimit)
			}
			_, err = g.Acquire(ctx, "m")
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			require.ErrorIs(t, err, slots.ErrQueueFull)
			ra = le.RetryAfter
			cancel()
			<-w
			a.Slot.Release()
		})
		return ra
	}
	without, with := run(0), run(5)
	t.Logf("queue-full Retry-After: %v without too-heavy refusals before it, %v after 5", without, with)
	assert.Equal(t, without, with)
}

// The pass looks at most core.PassScan waiters past the first blocker:
// past them, a provider's blocker keeps its place (a request that would
// fit further back waits), and a model's blocker keeps its model's while
// other models' requests still start.
func TestTokensPassLooksAtMostPassScan(t *testing.T) {
	t.Run("provider", func(t *testing.T) {
		for _, behind := range []int{core.PassScan - 1, core.PassScan} {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, pacing.Config{MaxInflightTokens: 50, MaxQueue: 200, MaxQueueWaitMS: pacing.MaxMS})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				a, err := g.AcquireN(ctx, "m", 40)
				require.NoError(t, err)
				acquireNAsync(ctx, g, "m", 40) // the blocker
				synctest.Wait()
				for range behind {
					acquireNAsync(ctx, g, "m", 20) // none fits
					synctest.Wait()
				}
				small := acquireNAsync(ctx, g, "m", 1)
				synctest.Wait()
				r, started := ready(small)
				assert.Equal(t, behind < core.PassScan, started, "%d waiters between", behind)
				if started && r.err == nil {
					r.g.Slot.Release()
				}
				cancel()
				synctest.Wait()
				a.Slot.Release()
			})
		}
	})
	t.Run("model", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g, ctx := bigModelBlocked(t)
			for range core.PassScan {
				acquireNAsync(ctx, g, "big", 20)
				synctest.Wait()
			}
			bigSmall := acquireNAsync(ctx, g, "big", 1)
			small := acquireNAsync(ctx, g, "small", 1)
			synctest.Wait()
			_, started := ready(bigSmall)
			assert.False(t, started, "past the scan, the model's blocker keeps its place")
			r, started := ready(small)
			assert.True(t, started, "another model's request starts")
			if started && r.err == nil {
				r.g.Slot.Release()
			}
		})
	})
}

// A model's blocker is passed, and counted, by its model's requests
// alone: other models' requests that start meanwhile take nothing of its
// bound.
func TestTokensModelBlockerCountsItsModelOnly(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g, ctx := bigModelBlocked(t)
		passTokens(t, g, "small", 40*core.PassFactor)
		later, err := g.AcquireN(ctx, "big", 5)
		require.NoError(t, err, "the other model took nothing of the blocker's bound")
		later.Slot.Release()
	})
}

// bigModelBlocked returns a Gate whose model "big" holds 40 of its 50
// tokens and has a request of 40 waiting, under its bound of passing, and
// the context of both. At the test's end the context ends (the waiters
// leave), then the 40 held are released.
func bigModelBlocked(t *testing.T) (*pacing.Gate, context.Context) {
	g := newGate(t, pacing.Config{MaxQueue: 200, MaxQueueWaitMS: pacing.MaxMS,
		Models: map[string]pacing.ModelConfig{"big": {MaxInflightTokens: 50}}})
	ctx, cancel := context.WithCancel(context.Background())
	a, err := g.AcquireN(ctx, "big", 40)
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		synctest.Wait()
		a.Slot.Release()
	})
	acquireNAsync(ctx, g, "big", 40)
	synctest.Wait()
	return g, ctx
}
