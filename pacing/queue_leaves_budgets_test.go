package pacing_test

import (
	"context"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
)

// Requests that leave the Gate's queue every way a Transport lets them
// (their context cancelled, their wait context ended, their wait timed
// out, refused by a budget kept outside at its Start) leave nothing
// counted as queued on the budgets: once a minute has passed with nothing
// started, a request larger than the budget is its first and passes at
// once.
func TestQueueLeavesNothingOnTheBudgets(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 5000,
			BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 100},
			Models:       map[string]pacing.ModelConfig{"m": {BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}}}})
		base, _ := answering(200, usageAnswer)
		s := &spend{}
		rt := pacing.NewTransport(base, gate, pacing.WithCutLinger(0), reserving(s))
		hold, err := gate.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 10})
		require.NoError(t, err)
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := pacing.WithTokens(context.Background(), pacing.Tokens{Input: 50, Output: 50})
				switch i % 3 {
				case 0:
					c, cancel := context.WithTimeout(ctx, time.Second)
					defer cancel()
					ctx = c
				case 1:
					w, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					defer cancel()
					ctx = pacing.WithWaitContext(ctx, w)
				}
				resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					t.Errorf("request %d admitted", i)
				}
			}()
		}
		synctest.Wait()
		assert.Positive(t, gate.Status().Queued)
		wg.Wait()
		hold.Slot.Release()
		time.Sleep(61 * time.Second)
		for _, b := range gate.Budgets() {
			assert.Zero(t, b.Queued, "%s %s: nothing queued", b.Model, b.Cap)
			assert.Equal(t, b.Limit, b.Left, "%s %s: nothing charged", b.Model, b.Cap)
		}
		p, m := pacing.QueuedTokens(gate)
		assert.Zero(t, p+m)
		resp, err := rt.RoundTrip(post(t, pacing.WithTokens(context.Background(), pacing.Tokens{Input: 5000}), `{"model":"m"}`))
		require.NoError(t, err, "the budgets' first request passes")
		done(t, resp)
	})
}
