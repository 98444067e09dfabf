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

// acquireTokensAsync starts an AcquireTokens and delivers its outcome.
func acquireTokensAsync(ctx context.Context, g *pacing.Gate, model string, t pacing.Tokens) chan result {
	c := make(chan result, 1)
	go func() {
		gt, err := g.AcquireTokens(ctx, model, t)
		c <- result{gt, err}
	}()
	return c
}

// providerBudget returns the provider's budget named c in st.
func providerBudget(t *testing.T, st pacing.Status, c string) pacing.BudgetStatus {
	t.Helper()
	for _, b := range st.Budgets {
		if b.Cap == c && b.Model == "" {
			return b
		}
	}
	require.Failf(t, "no budget", "%s in %+v", c, st.Budgets)
	return pacing.BudgetStatus{}
}

// A budget's first request passes even when it is larger than the budget;
// it is charged, and the next waits until it has left the last minute.
func TestBudgetFirstRequestPasses(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 120_000})
		ctx := context.Background()
		start := time.Now()
		big, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1400, Output: 100})
		require.NoError(t, err, "the first request passes")
		big.Slot.Release()
		assert.Equal(t, -500, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left)

		next := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 10})
		synctest.Wait()
		assert.Equal(t, 1, g.Status().Queued)
		r := <-next
		require.NoError(t, r.err)
		waited := time.Since(start)
		assert.Greater(t, waited, time.Minute, "not before the first has left the minute")
		assert.LessOrEqual(t, waited, time.Minute+time.Second, "counted by the second")
		r.g.Slot.Release()
	})
}

// Settle returns an overestimate at once (a waiter that now fits starts)
// and charges an underestimate as debt that later requests wait for.
func TestBudgetSettle(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 120_000})
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 100, Output: 700})
		require.NoError(t, err)
		waiter := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 500})
		synctest.Wait()
		require.Equal(t, 1, g.Status().Queued, "800 + 500 is over 1000")
		g.Settle(a, pacing.Tokens{Input: 100, Output: 50})
		synctest.Wait()
		r := <-waiter
		require.NoError(t, r.err, "the overestimate came back: 150 + 500 fit")
		assert.Equal(t, 350, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left)
		g.Settle(a, pacing.Tokens{Input: 5000}) // a second Settle changes nothing
		assert.Equal(t, 350, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left)
		a.Slot.Release()

		g.Settle(r.g, pacing.Tokens{Input: 500, Output: 600}) // after 500 estimated: 600 of debt
		r.g.Slot.Release()
		assert.Equal(t, -250, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left)
		start := time.Now()
		c, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1})
		require.NoError(t, err)
		assert.Greater(t, time.Since(start), 59*time.Second, "the debt is waited out")
		c.Slot.Release()
	})
}

// What a request never sent or refused by the upstream charged is
// returned; a request refused by the Gate charges nothing.
func TestBudgetRefusedChargesNothing(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}, MaxQueueWaitMS: 1000})
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900})
		require.NoError(t, err)

		_, err = g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 200})
		require.ErrorIs(t, err, pacing.ErrOverBudget, "it could not start within the 1 s wait")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapTokensPerMinute, le.Cap)
		assert.Equal(t, 900, le.InFlight)
		assert.Equal(t, 1000, le.Limit)
		// It could start in 60 to 61 s, and may queue for the last second.
		assert.Greater(t, le.RetryAfter, 58*time.Second)
		assert.LessOrEqual(t, le.RetryAfter, 60*time.Second)
		status, retry := slots.HTTPStatus(err)
		assert.Equal(t, 429, status)
		assert.Equal(t, 60*time.Second, retry)
		assert.Equal(t, 100, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left, "the refusal charged nothing")

		g.Report(a, pacing.Verdict{Kind: pacing.Concurrency})
		assert.Equal(t, 1000, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left, "the upstream refused it: nothing charged")
		g.Settle(a, pacing.Tokens{Input: 900}) // settled already by the refusal
		assert.Equal(t, 1000, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left)
		a.Slot.Release()
	})
}

// A request whose context ends as it is granted is given back: it
// charges nothing.
func TestBudgetGivenBack(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
		a, err := g.AcquireTokens(context.Background(), "m", pacing.Tokens{Input: 100})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		w := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 300})
		synctest.Wait()
		// The release grants the waiter; its context ends before it runs.
		g.Settle(a, pacing.Tokens{Input: 100})
		a.Slot.Release()
		cancel()
		r := <-w
		if r.err == nil { // granted before it saw the end: it holds
			t.Log("granted before the cancel")
			r.g.Slot.Release()
			assert.Equal(t, 600, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left)
			return
		}
		assert.ErrorIs(t, r.err, context.Canceled)
		assert.Equal(t, 900, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left, "given back: nothing charged")
	})
}

// Input and output budgets count their parts apart; a request waiting on
// the provider's budget keeps later ones (and other models) behind it,
// while a model's budget holds back only that model's.
func TestBudgetPartsAndOrder(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{InputTokensPerMinute: 1000, OutputTokensPerMinute: 100}, MaxQueueWaitMS: 120_000,
			Models: map[string]pacing.ModelConfig{"small": {BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 50}}}})
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 10, Output: 90})
		require.NoError(t, err)
		a.Slot.Release()
		st := g.Status()
		assert.Equal(t, 990, providerBudget(t, st, pacing.CapInputTokensPerMinute).Left)
		assert.Equal(t, 10, providerBudget(t, st, pacing.CapOutputTokensPerMinute).Left)
		require.Len(t, st.Budgets, 3)
		assert.Equal(t, pacing.BudgetStatus{Cap: pacing.CapTokensPerMinute, Model: "small", Limit: 50, Left: 50}, st.Budgets[2])
		assert.Equal(t, st.Budgets, g.Budgets())
		in := providerBudget(t, st, pacing.CapInputTokensPerMinute)
		assert.Greater(t, in.ResetIn, 60*time.Second, "all of it back once the second it started in has left the minute")
		assert.LessOrEqual(t, in.ResetIn, 61*time.Second)

		s, err := g.AcquireTokens(ctx, "small", pacing.Tokens{Input: 40})
		require.NoError(t, err)
		s.Slot.Release()
		small := acquireTokensAsync(ctx, g, "small", pacing.Tokens{Input: 20})
		synctest.Wait()
		other, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 500})
		require.NoError(t, err, "a model's budget holds back that model only")
		other.Slot.Release()

		heavy := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 10, Output: 20})
		synctest.Wait()
		light := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 10})
		synctest.Wait()
		assert.Equal(t, 3, g.Status().Queued, "the output budget holds the heavy one, and the light one behind it")
		for _, c := range []chan result{small, heavy, light} {
			r := <-c
			require.NoError(t, r.err)
			r.g.Slot.Release()
		}
	})
}

func TestBudgetConfig(t *testing.T) {
	_, err := pacing.Parse([]byte(`{"tokens_per_minute": -1}`))
	assert.ErrorContains(t, err, "tokens_per_minute: -1 is negative")
	_, err = pacing.Parse([]byte(`{"models": {"a": {"output_tokens_per_minute": -5}}}`))
	assert.ErrorContains(t, err, `models["a"].output_tokens_per_minute: -5 is negative`)
	c, err := pacing.Parse([]byte(`{"tokens_per_minute": 90000, "input_tokens_per_minute": 80000, "models": {"a": {"tokens_per_minute": 1000}}}`))
	require.NoError(t, err)
	assert.Equal(t, 90000, c.TokensPerMinute)
	assert.Equal(t, 80000, c.InputTokensPerMinute)
	assert.Equal(t, 1000, c.Models["a"].TokensPerMinute)
	for _, bad := range []pacing.Tokens{{}, {Input: -1, Output: 5}, {Input: slots.MaxUnits, Output: 1}} {
		g := newGate(t, pacing.Config{})
		_, err := g.AcquireTokens(context.Background(), "m", bad)
		assert.ErrorIs(t, err, slots.ErrBadUnits, "%+v", bad)
	}
}

// Each API key of a pool may have budgets of its own: a request is given
// a key whose budgets take it; when none can, it waits in its place (and
// those after it too) until one can, by a refill or by a Settle; a wait
// that times out names the key's budget.
func TestBudgetAPIKeys(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := pacing.Config{MaxQueueWaitMS: 120_000, APIKeys: []pacing.KeyConfig{
			{ID: "k1", MaxConcurrentRequests: 10, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}},
			{ID: "k2", MaxConcurrentRequests: 10, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}},
		}}
		g := newGate(t, cfg)
		ctx := context.Background()
		r1, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 600})
		require.NoError(t, err)
		r2, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 600})
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"k1", "k2"}, []string{r1.Key, r2.Key}, "one on each: neither budget takes both")
		st := g.Status()
		require.Len(t, st.Budgets, 2)
		assert.Equal(t, 400, st.Budgets[0].Left)
		assert.Equal(t, r1.Key, st.Budgets[0].Key)

		third := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 600})
		synctest.Wait()
		small := acquireTokensAsync(ctx, g, "m", pacing.Tokens{Input: 300})
		synctest.Wait()
		assert.Equal(t, 2, g.Status().Queued, "no key takes 600; the 300 behind it waits its turn")
		g.Settle(r1, pacing.Tokens{Input: 100}) // r1's key gets 500 back
		synctest.Wait()
		r3 := <-third
		require.NoError(t, r3.err)
		assert.Equal(t, r1.Key, r3.g.Key)
		r4 := <-small
		require.NoError(t, r4.err)
		assert.Equal(t, r2.Key, r4.g.Key, "the other key takes the 300")

		start := time.Now()
		late, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 500})
		require.NoError(t, err, "it waits for a refill")
		assert.Greater(t, time.Since(start), 59*time.Second)
		for _, s := range []pacing.Grant{r1, r2, r3.g, r4.g, late} {
			s.Slot.Release()
		}

		g = newGate(t, pacing.Config{MaxQueueWaitMS: 1000, APIKeys: []pacing.KeyConfig{{ID: "k", BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}}}})
		held, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 900})
		require.NoError(t, err)
		defer held.Slot.Release()
		start = time.Now()
		_, err = g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 200})
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.ErrorIs(t, err, pacing.ErrOverBudget, "refused at once: the key's budget cannot take it within the wait")
		assert.Zero(t, time.Since(start))
		assert.Equal(t, time.Minute, le.RetryAfter, "the refill (in 61 s: the charge's second has left the minute) less the wait it may queue")
		assert.Equal(t, "api_key_"+pacing.CapTokensPerMinute, le.Cap)
		assert.Equal(t, 1000, le.Limit)
	})
}

// A pool whose every key is in a budget's debt starts nothing until the
// debt has left the minute, and then starts its waiter without another
// event to wake it.
func TestBudgetAPIKeysInDebt(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxQueueWaitMS: 120_000, APIKeys: []pacing.KeyConfig{{ID: "k", BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 100}}}})
		ctx := context.Background()
		a, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 50})
		require.NoError(t, err)
		g.Settle(a, pacing.Tokens{Input: 500}) // 400 of debt
		a.Slot.Release()
		start := time.Now()
		b, err := g.AcquireTokens(ctx, "m", pacing.Tokens{Input: 1})
		require.NoError(t, err)
		assert.Greater(t, time.Since(start), 59*time.Second)
		assert.LessOrEqual(t, time.Since(start), 61*time.Second)
		b.Slot.Release()
	})
}
