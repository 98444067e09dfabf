package pacing_test

import (
	"cmp"
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A budget of requests per minute counts each request once, whatever its
// tokens: at most that many start in any minute, in a burst if they come
// so; a request refused by the Gate, given back or refused by the upstream
// charges nothing; one served stays counted whatever usage it reports.
func TestMaxRequestsPerMinute(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 3}, MaxQueueWaitMS: 1000})
		ctx := context.Background()
		var held []pacing.Grant
		for range 3 { // a burst: no spacing
			gr, err := g.Acquire(ctx, "m")
			require.NoError(t, err)
			held = append(held, gr)
		}
		b := providerBudget(t, g.Status(), pacing.CapMaxRequestsPerMinute)
		assert.Equal(t, 0, b.Left)
		assert.Equal(t, 3, b.Limit)
		assert.Equal(t, time.Minute+time.Second, b.ResetIn, "counted in the second they started, gone once it has left the minute")

		_, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1})
		require.ErrorIs(t, err, pacing.ErrOverBudget)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapMaxRequestsPerMinute, le.Cap)
		assert.Equal(t, 3, le.InFlight)
		assert.Equal(t, 3, le.Limit)
		assert.Greater(t, le.RetryAfter, 58*time.Second)
		assert.LessOrEqual(t, le.RetryAfter, 61*time.Second)
		assert.Equal(t, 0, providerBudget(t, g.Status(), pacing.CapMaxRequestsPerMinute).Left, "the refusal charged nothing")

		g.Settle(held[0], pacing.Tokens{Input: 100, Output: 900}) // served: it stays counted
		g.Report(held[1], pacing.Verdict{Kind: pacing.Concurrency})
		assert.Equal(t, 1, providerBudget(t, g.Status(), pacing.CapMaxRequestsPerMinute).Left, "refused by the upstream: not counted")
		for _, gr := range held {
			gr.Slot.Release()
		}

		// Once the burst has left the minute, the budget is whole again.
		time.Sleep(time.Minute + time.Second)
		assert.Equal(t, 3, providerBudget(t, g.Status(), pacing.CapMaxRequestsPerMinute).Left)
	})
}

// A request whose context ends as it is granted is given back: it is not
// counted on the requests budget.
func TestMaxRequestsPerMinuteGivenBack(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 10}})
		a, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		w := acquireAsync(ctx, g, "m")
		synctest.Wait()
		a.Slot.Release() // grants the waiter; its context ends before it runs
		cancel()
		r := <-w
		if r.err == nil {
			t.Log("granted before the cancel")
			r.g.Slot.Release()
			assert.Equal(t, 8, providerBudget(t, g.Status(), pacing.CapMaxRequestsPerMinute).Left)
			return
		}
		assert.ErrorIs(t, r.err, context.Canceled)
		assert.Equal(t, 9, providerBudget(t, g.Status(), pacing.CapMaxRequestsPerMinute).Left, "given back: not counted")
	})
}

// Requests the requests budget refuses are told to come back one after
// another over the refill, not together.
func TestMaxRequestsPerMinuteSpreadsRefusals(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ctx := context.Background()
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 2}, MaxQueueWaitMS: 1})
		for range 2 {
			gr, err := g.Acquire(ctx, "m")
			require.NoError(t, err)
			gr.Slot.Release()
		}
		var told []time.Duration
		for range 4 {
			_, err := g.Acquire(ctx, "m")
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			require.ErrorIs(t, err, pacing.ErrOverBudget)
			told = append(told, le.RetryAfter)
		}
		t.Logf("told to come back after %v", told)
		assert.IsNonDecreasing(t, told)
		// Two a minute: the third and fourth refused come a minute after the
		// first two.
		assert.GreaterOrEqual(t, told[2]-told[0], 59*time.Second, "the later refused come back after the earlier ones")
	})
}

// A model's and an API key's requests budgets refuse under their own
// names; a pool sends a request to a key whose budget takes it.
func TestMaxRequestsPerMinuteModelAndKeys(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxQueueWaitMS: 1, Models: map[string]pacing.ModelConfig{
			"m": {BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
		}})
		ctx := context.Background()
		gr, err := g.Acquire(ctx, "m")
		require.NoError(t, err)
		gr.Slot.Release()
		_, err = g.Acquire(ctx, "m")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "model_"+pacing.CapMaxRequestsPerMinute, le.Cap)
		other, err := g.Acquire(ctx, "other")
		require.NoError(t, err, "another model is not counted on m's budget")
		other.Slot.Release()

		g = newGate(t, pacing.Config{MaxQueueWaitMS: 1000, APIKeys: []pacing.KeyConfig{
			{ID: "k1", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
			{ID: "k2", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
		}})
		a, err := g.Acquire(ctx, "m")
		require.NoError(t, err)
		b, err := g.Acquire(ctx, "m")
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"k1", "k2"}, []string{a.Key, b.Key}, "one request on each key")
		_, err = g.Acquire(ctx, "m")
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "api_key_"+pacing.CapMaxRequestsPerMinute, le.Cap)
		a.Slot.Release()
		b.Slot.Release()
	})
}

// A Budget on its own counts a request whose tokens nobody counted (zero
// Tokens) on its requests budget alone; its first request passes; Cancel
// takes the request back, Settle keeps it.
func TestBudgetMaxRequestsPerMinute(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 2})
		require.NoError(t, err)
		left := func(c string) int {
			for _, s := range b.Status() {
				if s.Cap == c {
					return s.Left
				}
			}
			t.Fatalf("no %s in %+v", c, b.Status())
			return 0
		}
		r1, err := b.Reserve(pacing.Tokens{})
		require.NoError(t, err, "no tokens counted: the requests budget alone")
		assert.Equal(t, 100, left(pacing.CapTokensPerMinute))
		assert.Equal(t, 1, left(pacing.CapMaxRequestsPerMinute))
		r2, err := b.Reserve(pacing.Tokens{Input: 500})
		require.NoError(t, err, "the token budget's first request passes, however large")
		_, err = b.Reserve(pacing.Tokens{})
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapMaxRequestsPerMinute, le.Cap, "uncounted tokens wait for no token budget, even one in debt")
		r2.Cancel()
		assert.Equal(t, 1, left(pacing.CapMaxRequestsPerMinute), "cancelled: its request is not counted")
		assert.Equal(t, 100, left(pacing.CapTokensPerMinute))
		r1.Settle(pacing.Tokens{Input: 40})
		assert.Equal(t, 1, left(pacing.CapMaxRequestsPerMinute), "settled: it stays counted")
		assert.Equal(t, 60, left(pacing.CapTokensPerMinute), "its tokens charged after the fact")

		_, err = b.Reserve(pacing.Tokens{Input: -1})
		assert.ErrorIs(t, err, slots.ErrBadUnits)
		_, err = pacing.NewBudget(pacing.BudgetLimits{MaxRequestsPerMinute: -1})
		assert.ErrorContains(t, err, "max_requests_per_minute: -1 is negative")
	})
}

// In a configuration, max_requests_per_minute (a budget: at most that many
// in any minute) stands beside requests_per_minute (pacing: starts spaced
// evenly), in the provider's, a model's and a key's sections.
func TestMaxRequestsPerMinuteConfig(t *testing.T) {
	var cfg pacing.Config
	require.NoError(t, json.Unmarshal([]byte(`{"requests_per_minute": 600, "max_requests_per_minute": 500,
		"models": {"m": {"requests_per_minute": 60, "max_requests_per_minute": 50}},
		"api_keys": [{"id": "k", "max_requests_per_minute": 40}]}`), &cfg))
	assert.Equal(t, 600, cfg.RequestsPerMinute)
	assert.Equal(t, 500, cfg.MaxRequestsPerMinute)
	assert.Equal(t, 60, cfg.Models["m"].RequestsPerMinute)
	assert.Equal(t, 50, cfg.Models["m"].MaxRequestsPerMinute)
	assert.Equal(t, 40, cfg.APIKeys[0].MaxRequestsPerMinute)
	require.NoError(t, cfg.Validate())
	cfg.Models["m"] = pacing.ModelConfig{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: -2}}
	assert.ErrorContains(t, cfg.Validate(), `models["m"].max_requests_per_minute: -2 is negative`)
}

// A waiter held by the provider's, a model's or every API key's requests
// budget alone starts once the minute has let go of a request, with no
// other event to wake it.
func TestMaxRequestsPerMinuteWakesWaiters(t *testing.T) {
	for name, cfg := range map[string]pacing.Config{
		"provider": {MaxQueueWaitMS: 120_000, BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
		"model":    {MaxQueueWaitMS: 120_000, Models: map[string]pacing.ModelConfig{"m": {BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}}}},
		"keys": {MaxQueueWaitMS: 120_000, APIKeys: []pacing.KeyConfig{
			{ID: "k1", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
			{ID: "k2", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, cfg)
				ctx := context.Background()
				start := time.Now()
				first := 1
				if name == "keys" {
					first = 2 // one on each key
				}
				for range first {
					gr, err := g.Acquire(ctx, "m")
					require.NoError(t, err)
					gr.Slot.Release()
				}
				w := acquireAsync(ctx, g, "m")
				synctest.Wait()
				require.Equal(t, 1, g.Status().Queued, "it waits for the minute")
				r := <-w
				require.NoError(t, r.err)
				assert.Greater(t, time.Since(start), time.Minute)
				assert.LessOrEqual(t, time.Since(start), time.Minute+time.Second)
				r.g.Slot.Release()
			})
		})
	}
}

// Requests that every key's budget keeps out are told to come back one
// after another over the keys' refills, as the provider's budget tells
// them: timed out in the queue (the default), and under "proceed", where
// a key's budget refuses a request that waited its longest.
func TestKeyBudgetSpreadsRefusals(t *testing.T) {
	for _, onTimeout := range []string{"", "proceed"} {
		t.Run(cmp.Or(onTimeout, "reject"), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				ctx := context.Background()
				keys := []pacing.KeyConfig{
					{ID: "a", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
					{ID: "b", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}},
				}
				g := newGate(t, pacing.Config{APIKeys: keys, MaxQueueWaitMS: 1, OnWaitTimeout: onTimeout})
				for range 2 {
					gr, err := g.Acquire(ctx, "m")
					require.NoError(t, err)
					gr.Slot.Release()
				}
				var told []time.Duration
				start := time.Now()
				for range 6 {
					_, err := g.Acquire(ctx, "m")
					var le *slots.LimitError
					require.ErrorAs(t, err, &le)
					require.ErrorIs(t, err, pacing.ErrOverBudget, "at once: no key's budget takes it within the wait")
					assert.Equal(t, "api_key_max_requests_per_minute", le.Cap)
					told = append(told, time.Since(start)+le.RetryAfter) // when, since the first refusal began
				}
				t.Logf("told to come back at %v", told)
				assert.IsNonDecreasing(t, told)
				// Two keys, one request a minute each: two refused come back
				// as the keys refill, the next two a minute later, and so on.
				assert.GreaterOrEqual(t, told[2]-told[0], 59*time.Second, "the later refused come back after the earlier ones")
				assert.GreaterOrEqual(t, told[4]-told[2], 59*time.Second)
			})
		})
	}
}
