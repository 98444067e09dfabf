package pacing_test

import (
	"context"
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
