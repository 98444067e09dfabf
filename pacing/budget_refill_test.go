package pacing_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A request larger than its budget, behind a queued one, needs one empty
// minute of the budget (a budget's first request passes), not one per
// budget's worth of its cost: it is told to come back when it can queue
// for that minute, and it is queued, not refused, when its wait reaches
// it. Found by a bug hunt: told 2m31s, and refused with a wait of 200 s.
func TestBudgetTakesALargeRequestInOneEmptyMinute(t *testing.T) {
	for _, tc := range []struct {
		name   string
		waitMS int64
	}{{"told", 90_000}, {"queued", 200_000}} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: tc.waitMS})
				ctx := context.Background()
				a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 500})
				require.NoError(t, err)
				a.Slot.Release()
				b := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 600})
				synctest.Wait()
				require.Equal(t, 1, g.Status().Queued, "B waits for A's minute")

				// B starts at 61 s and leaves the window at 122 s, when C, the
				// window's only request, passes.
				start := time.Now()
				c, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 3000})
				if tc.waitMS < 122_000 {
					var le *slots.LimitError
					require.ErrorAs(t, err, &le)
					require.ErrorIs(t, err, pacing.ErrOverBudget)
					t.Logf("told %v", le.RetryAfter)
					assert.LessOrEqual(t, le.RetryAfter, 40*time.Second, "come back at 122-90 s and queue")
					time.Sleep(le.RetryAfter)
					c, err = g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 3000})
				}
				require.NoError(t, err)
				t.Logf("C started at %v", time.Since(start))
				assert.LessOrEqual(t, time.Since(start), 123*time.Second)
				c.Slot.Release()
				r := <-b
				require.NoError(t, r.err)
				r.g.Slot.Release()
			})
		})
	}
}

// A client that honours a budget refusal's Retry-After is queued on its
// return and started within its wait: each budget's worth queued ahead
// takes the window's 61 steps of a second to clear, not 60, and a waiter
// whose turn comes as its wait ends starts. Found by a bug hunt: it timed
// out a second before the budget would take it.
func TestBudgetRetryAfterHonouredStarts(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 90_000})
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900})
		require.NoError(t, err)
		a.Slot.Release()
		b := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 900})
		synctest.Wait()
		require.Equal(t, 1, g.Status().Queued, "B waits for A's minute")

		_, err = g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900})
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, pacing.ErrOverBudget)
		t.Logf("C told %v", le.RetryAfter)
		time.Sleep(le.RetryAfter)
		back := time.Now()
		c, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900})
		require.NoError(t, err, "queued on coming back, and started after %v", time.Since(back))
		c.Slot.Release()
		r := <-b
		require.NoError(t, r.err)
		r.g.Slot.Release()
	})
}

// A key taken out of the pool and put back while its requests are in
// flight still counts them: its cap holds. Found by a bug hunt: the key
// came back as a new lane, and a second request took its one slot.
func TestKeyPutBackKeepsItsHolders(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		with := pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k", MaxConcurrentRequests: 1}}}
		without := pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "j", MaxConcurrentRequests: 1}}}
		g := newGate(t, with)
		a, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		require.Equal(t, "k", a.Key)
		require.NoError(t, g.Reconfigure(without))
		require.NoError(t, g.Reconfigure(with))
		assert.Equal(t, map[string]int{"k": 1}, g.Status().ByKey)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		b, err := g.Acquire(ctx, "m")
		if err == nil {
			b.Slot.Release()
		}
		require.Error(t, err, "k's one slot is still held")
		a.Slot.Release()
		c, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err, "and free once released")
		c.Slot.Release()
	})
}

// A queued request larger than its budget counts at most one budget's
// worth in the estimate of the requests after it, as it is taken (one
// empty minute), also once Reconfigure has changed the limit under it;
// nothing stays counted as queued once the queue is empty. Found by an
// adversarial review: B, which would start at 61 s within its 90 s wait,
// was refused and told 3m35s.
func TestQueuedOversizeCountsOneBudget(t *testing.T) {
	for _, reconfigure := range []bool{false, true} {
		t.Run(fmt.Sprint("reconfigured=", reconfigure), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				cfg := func(tpm int) pacing.Config {
					return pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 90_000,
						Models: map[string]pacing.ModelConfig{"m": {BudgetLimits: pacing.BudgetLimits{TokensPerMinute: tpm}}}}
				}
				g := newGate(t, cfg(100))
				ctx := context.Background()
				h, err := g.Acquire(ctx, "x") // holds the one slot; m's budget is empty
				require.NoError(t, err)
				a := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 500})
				synctest.Wait()
				require.Equal(t, 1, g.Status().Queued)
				if reconfigure {
					require.NoError(t, g.Reconfigure(cfg(200))) // A counted anew: 200, not the 100 it was
				}
				start := time.Now()
				bc := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 50})
				synctest.Wait()
				h.Slot.Release()
				ra := <-a
				require.NoError(t, ra.err)
				ra.g.Slot.Release()
				rb := <-bc
				require.NoError(t, rb.err, "B starts at 61 s, within its 90 s wait")
				t.Logf("B started at %v", time.Since(start))
				rb.g.Slot.Release()
				for _, b := range g.Status().Budgets {
					assert.Zero(t, b.Queued, "%s: nothing left counted as queued", b.Cap)
				}
			})
		})
	}
}

// An API key taken out of the pool while its learned cap's probe is out,
// and put back while the probe still holds it, learns on: the probe is
// taken as admitted once released unanswered. Found by an adversarial
// review: the key's learner kept a timer that had fired while it was out,
// and its cap stayed at the floor.
func TestKeyPutBackLearnsOn(t *testing.T) {
	for _, removeIt := range []bool{false, true} {
		t.Run(fmt.Sprint("removed=", removeIt), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				with := pacing.Config{Adaptive: &pacing.AdaptiveConfig{Min: 1, Max: 4, Initial: 4},
					APIKeys: []pacing.KeyConfig{{ID: "k", MaxConcurrentRequests: 4}}}
				without := with
				without.APIKeys = []pacing.KeyConfig{{ID: "j", MaxConcurrentRequests: 4}}
				g := newGate(t, with)
				ctx := context.Background()
				a, err := g.Acquire(ctx, "m")
				require.NoError(t, err)
				b, err := g.Acquire(ctx, "m")
				require.NoError(t, err)
				time.Sleep(100 * time.Millisecond)
				g.Report(b, pacing.Verdict{Kind: pacing.Concurrency}) // a cut
				b.Slot.Release()
				a.Slot.Release()
				c, err := g.Acquire(ctx, "m") // the test of the cut: the probe
				require.NoError(t, err)
				if removeIt {
					require.NoError(t, g.Reconfigure(without))
				}
				time.Sleep(time.Minute) // the probe's timer comes due
				if removeIt {
					require.NoError(t, g.Reconfigure(with)) // c still holds k
				}
				c.Slot.Release() // unanswered
				time.Sleep(time.Hour)
				d, err := g.Acquire(ctx, "m")
				require.NoError(t, err)
				d.Slot.Release()
				time.Sleep(time.Hour)
				l := g.Learned().Keys["k"]
				t.Logf("an hour later: %+v", l)
				assert.Greater(t, l.Limit, 1, "the probe is taken as admitted")
			})
		})
	}
}

// A key put back twice keeps its holder and its minute; a release after
// the Gate is closed frees it; a key taken out without holders comes back
// with a fresh lane and its budget's minute.
func TestKeyPutBackTwiceAndClose(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		with := pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k", MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}}}}
		without := pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "j", MaxConcurrentRequests: 1}}}
		g := newGate(t, with)
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 600})
		require.NoError(t, err)
		for range 2 {
			require.NoError(t, g.Reconfigure(without))
			require.NoError(t, g.Reconfigure(without))
			require.NoError(t, g.Reconfigure(with))
		}
		st := g.Status()
		require.Equal(t, map[string]int{"k": 1}, st.ByKey)
		require.Equal(t, 400, st.Budgets[0].Left, "k's minute kept")
		g.Settle(a, pacing.Tokens{Input: 100})
		a.Slot.Release()
		st = g.Status()
		require.Equal(t, map[string]int{"k": 0}, st.ByKey)
		require.Equal(t, 900, st.Budgets[0].Left, "settled into k's budget")
		b, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 800})
		require.NoError(t, err, "k's one slot free again")
		require.Equal(t, "k", b.Key)
		require.NoError(t, g.Reconfigure(without))
		g.Close()
		b.Slot.Release()
		require.Equal(t, 0, g.Status().InFlight)

		g2 := newGate(t, with)
		c, err := g2.AcquireTokens(ctx, "m", pacing.Tokens{Input: 600})
		require.NoError(t, err)
		c.Slot.Release()
		require.NoError(t, g2.Reconfigure(without))
		require.NoError(t, g2.Reconfigure(with))
		require.Equal(t, 400, g2.Status().Budgets[0].Left, "kept via retired")
	})
}
