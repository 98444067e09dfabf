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

// A refusal's Retry-After counts what keeps the request from starting when
// that is not the provider's or the model's cap: a full pool of API keys
// (turns of the pool's slots), every key out of quota (until the first is
// back), a pause the upstream asked for (until it ends), and a budget the
// queue waits on (its refill). Each was told 1 ms.
func TestRefusalRetryAfterPastTheCaps(t *testing.T) {
	pool := []pacing.KeyConfig{{ID: "a", MaxConcurrentRequests: 1}, {ID: "b", MaxConcurrentRequests: 1}}
	refused := func(t *testing.T, err error, cap string) time.Duration {
		t.Helper()
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, cap, le.Cap)
		return le.RetryAfter
	}
	// Two holders of a mean hold of 10 s on a pool of two keys of one.
	fullPool := func(t *testing.T, cfg pacing.Config) *pacing.Gate {
		g := newGate(t, cfg)
		testrig.WarmHolds(t, 10*time.Second, func() (*slots.Slot, error) { gr, err := g.Acquire(context.Background(), "m"); return gr.Slot, err })
		for range 2 {
			gr, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			t.Cleanup(func() { gr.Slot.Release() })
		}
		return g
	}
	t.Run("a full pool, its queue full", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := fullPool(t, pacing.Config{MaxQueue: 2, APIKeys: pool})
			ctx, cancel := context.WithCancel(context.Background())
			for range 2 {
				w := acquireAsync(ctx, g, "m")
				t.Cleanup(func() { <-w })
			}
			t.Cleanup(cancel)
			synctest.Wait()
			ra := refused(t, firstErr(g.Acquire(ctx, "m")), pacing.CapProvider)
			t.Logf("told %v", ra)
			assert.GreaterOrEqual(t, ra, 5*time.Second, "two ahead and two holding, on two slots of 10 s")
		})
	})
	t.Run("a full pool, waits timed out", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := fullPool(t, pacing.Config{MaxQueueWaitMS: 2000, APIKeys: pool})
			var told []time.Duration
			for range 5 {
				told = append(told, refused(t, firstErr(g.Acquire(context.Background(), "m")), pacing.CapAPIKey))
			}
			t.Logf("told %v", told)
			assert.IsNonDecreasing(t, told)
			assert.GreaterOrEqual(t, told[0], time.Second, "the pool frees nothing for 8 s")
			assert.Greater(t, told[4], told[0], "spread over the pool's turns")
		})
	})
	t.Run("every key out of quota", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxQueueWaitMS: 100, APIKeys: []pacing.KeyConfig{{ID: "a"}, {ID: "b"}}})
			for range 2 {
				gr, err := g.Acquire(context.Background(), "m")
				require.NoError(t, err)
				g.Report(gr, pacing.Verdict{Kind: pacing.Quota, RetryAfter: time.Minute})
				gr.Slot.Release()
			}
			ra := refused(t, firstErr(g.Acquire(context.Background(), "m")), pacing.CapAPIKey)
			assert.InDelta(t, float64(time.Minute-100*time.Millisecond), float64(ra), float64(time.Second), "told %v: when the first key is back", ra)
		})
	})
	t.Run("every key of a full pool out of quota", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxQueueWaitMS: 100, APIKeys: pool})
			testrig.WarmHolds(t, 10*time.Second, func() (*slots.Slot, error) { gr, err := g.Acquire(context.Background(), "m"); return gr.Slot, err })
			for range 2 {
				gr, err := g.Acquire(context.Background(), "m")
				require.NoError(t, err)
				g.Report(gr, pacing.Verdict{Kind: pacing.Quota, RetryAfter: time.Minute})
				gr.Slot.Release()
			}
			var told []time.Duration
			for range 10 {
				told = append(told, refused(t, firstErr(g.Acquire(context.Background(), "m")), pacing.CapAPIKey))
			}
			t.Logf("told %v", told)
			assert.IsNonDecreasing(t, told)
			assert.GreaterOrEqual(t, told[0], time.Minute-100*time.Millisecond, "not before the first key is back")
			assert.GreaterOrEqual(t, told[9], told[0]+20*time.Second, "then spread over the pool's turns, not all at once")
		})
	})
	t.Run("a pause", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxConcurrentRequests: 5, MaxQueueWaitMS: 100})
			gr, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			g.Report(gr, pacing.Verdict{Kind: pacing.Rate, RetryAfter: 5 * time.Second})
			gr.Slot.Release()
			ra := refused(t, firstErr(g.Acquire(context.Background(), "m")), pacing.CapPause)
			assert.InDelta(t, float64(4900*time.Millisecond), float64(ra), float64(time.Millisecond), "told %v: when the pause ends", ra)
		})
	})
	t.Run("a queue full behind a budget", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxQueue: 1, MaxQueueWaitMS: 120_000, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
			ctx, cancel := context.WithCancel(context.Background())
			gr, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1000})
			require.NoError(t, err)
			gr.Slot.Release()
			w := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 500})
			t.Cleanup(func() { cancel(); <-w })
			synctest.Wait()
			_, err = g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 500})
			ra := refused(t, err, pacing.CapProvider)
			assert.GreaterOrEqual(t, ra, 59*time.Second, "told %v: nothing starts before the refill", ra)
		})
	})
}

// firstErr is the error of a call that returns a Grant and an error.
func firstErr(_ pacing.Grant, err error) error { return err }

// As on a Limiter (slots' TestRetryAfterOfWaitsADeadlineEnded), requests
// whose context's deadline passes while they wait for the provider are
// told when their turn was expected, one turn apart; the error stays the
// context's, and the Gate counts no refusal.
func TestRetryAfterOfWaitsADeadlineEnded(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 2})
		testrig.WarmHolds(t, time.Second, func() (*slots.Slot, error) { gr, err := g.Acquire(context.Background(), "m"); return gr.Slot, err })
		for range 2 {
			gr, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			t.Cleanup(func() { gr.Slot.Release() })
		}
		rejected := g.Status().Rejected
		got := testrig.DeadlineRetries(t, 4, 500*time.Millisecond, func(ctx context.Context) error {
			return firstErr(g.Acquire(ctx, "m"))
		})
		t.Logf("told %v", got)
		assert.Positive(t, got[0])
		assert.Greater(t, got[3], got[0], "spread over the provider's turns")
		assert.Equal(t, rejected, g.Status().Rejected, "no refusal counted")
	})
}
