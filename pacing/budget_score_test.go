package pacing_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// budgetRun is one client's request in a budget scenario: its estimate,
// what it will use, and how long it takes.
type budgetRun struct {
	est, used pacing.Tokens
	hold      time.Duration
}

// budgetStart is a request's start and what it used.
type budgetStart struct {
	at   time.Time
	used int
	over int // what it used past its estimate
}

// runBudget sends every request at once to a Gate under cfg; a refused
// client comes back after its Retry-After. It returns the starts and how
// many refusals there were.
func runBudget(t *testing.T, cfg pacing.Config, runs []budgetRun) (starts []budgetStart, refusals int) {
	cfg.MaxQueue = 2 * len(runs)
	g := newGate(t, cfg)
	var mu sync.Mutex
	var wg sync.WaitGroup
	overBudget := 0
	for _, r := range runs {
		wg.Go(func() {
			for {
				gt, err := g.AcquireTokens(context.Background(), "m", r.est)
				if le := (*slots.LimitError)(nil); errors.As(err, &le) { // a 429: over the budget, or waited too long
					_, retry := slots.HTTPStatus(err)
					mu.Lock()
					if errors.Is(err, pacing.ErrOverBudget) {
						overBudget++
					}
					refusals++
					mu.Unlock()
					time.Sleep(retry) // the client's wait, in the bubble's time
					continue
				}
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				starts = append(starts, budgetStart{time.Now(), r.used.Total(), max(r.used.Total()-r.est.Total(), 0)})
				mu.Unlock()
				time.Sleep(r.hold) // the upstream's answer
				g.Settle(gt, r.used)
				gt.Slot.Release()
				return
			}
		})
	}
	wg.Wait()
	t.Logf("%d refusals, %d of them over the budget, the others wait timeouts", refusals, overBudget)
	require.Len(t, starts, len(runs))
	slices.SortFunc(starts, func(a, b budgetStart) int { return a.at.Compare(b.at) })
	return starts, refusals
}

// worstMinute returns the most tokens started in any minute, and the debt
// (tokens used past their estimates) of the requests started in it.
func worstMinute(starts []budgetStart) (most, debt int) {
	for i := range starts {
		sum, over := 0, 0
		for _, s := range starts[i:] {
			if s.at.Sub(starts[i].at) >= time.Minute {
				break
			}
			sum += s.used
			over += s.over
		}
		if sum > most {
			most, debt = sum, over
		}
	}
	return most, debt
}

// 1,000 requests sent at once to a budget of 50,000 tokens a minute, each
// estimated as its prompt and the most it may answer (512), and answering
// less: no minute starts more than the budget, refused requests charged
// nothing (they all start in the end), and the budget is used. Clients
// that wait in the queue take little more than their tokens over the
// budget; clients refused at once and told when to come back, little more
// than their estimates over it (when they were told, nothing had yet
// shown how much less than estimated requests use).
func TestBudgetScoreFlood(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	runs := make([]budgetRun, 1000)
	used, est := 0, 0
	for i := range runs {
		in := 100 + rng.IntN(1500)
		runs[i] = budgetRun{est: pacing.Tokens{Input: in, Output: 512}, used: pacing.Tokens{Input: in, Output: rng.IntN(513)},
			hold: time.Duration(1+rng.IntN(20)) * time.Second}
		used += runs[i].used.Total()
		est += runs[i].est.Total()
	}
	const perMinute = 50_000
	minutes := func(tokens int) time.Duration {
		return time.Duration(float64(tokens) / perMinute * float64(time.Minute))
	}
	for _, tc := range []struct {
		name  string
		wait  int64 // the queue wait, ms
		bound time.Duration
	}{
		{"queued", 30 * 60_000, minutes(used)*11/10 + time.Minute},
		{"told to come back", 0, minutes(est) + time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				begin := time.Now()
				starts, refusals := runBudget(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: perMinute}, MaxQueueWaitMS: tc.wait}, runs)
				most, _ := worstMinute(starts)
				assert.LessOrEqual(t, most, perMinute, "no minute over the budget")
				took := starts[len(starts)-1].at.Sub(begin)
				t.Logf("%d tokens used (%d estimated), worst minute %d of %d; last start after %v (the tokens used over the budget: %v, %.0f%%); %d refusals",
					used, est, most, perMinute, took.Round(time.Second), minutes(used).Round(time.Second), 100*minutes(used).Seconds()/took.Seconds(), refusals)
				assert.Less(t, took, tc.bound, "the budget idles little")
			})
		})
	}
}

// A flood of max_tokens 1: estimates are exact to a token, so no minute
// starts more than the budget; a budget's first request passes though it
// is larger than the budget.
func TestBudgetScoreMaxTokensOne(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		const perMinute = 20_000
		rng := rand.New(rand.NewPCG(3, 4))
		runs := []budgetRun{{est: pacing.Tokens{Input: 30_000, Output: 1}, used: pacing.Tokens{Input: 30_000, Output: 1}, hold: time.Second}}
		for range 1000 {
			in := 50 + rng.IntN(200)
			runs = append(runs, budgetRun{est: pacing.Tokens{Input: in, Output: 1}, used: pacing.Tokens{Input: in, Output: rng.IntN(2)},
				hold: 100 * time.Millisecond})
		}
		cfg := pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: perMinute}}
		g := newGate(t, cfg)
		first, err := g.AcquireTokens(context.Background(), "m", runs[0].est)
		require.NoError(t, err, "the first request passes")
		first.Slot.Release()

		starts, refusals := runBudget(t, cfg, runs[1:])
		most, _ := worstMinute(starts)
		assert.LessOrEqual(t, most, perMinute)
		t.Logf("worst minute %d of %d tokens; %d refusals", most, perMinute, refusals)
	})
}

// Requests that use more than estimated: their debt is charged when they
// end, so a minute may start more than the budget by at most the debt of
// the requests started in it, and later requests wait it out.
func TestBudgetScoreUnderestimates(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		const perMinute = 30_000
		rng := rand.New(rand.NewPCG(5, 6))
		runs := make([]budgetRun, 500)
		largest := 0
		for i := range runs {
			in := 100 + rng.IntN(500)
			used := pacing.Tokens{Input: in, Output: rng.IntN(800)} // up to 400 past an estimate of 400
			runs[i] = budgetRun{est: pacing.Tokens{Input: in, Output: 400}, used: used, hold: time.Duration(1+rng.IntN(5)) * time.Second}
			largest = max(largest, used.Output-400)
		}
		starts, _ := runBudget(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: perMinute}}, runs)
		most, debt := worstMinute(starts)
		assert.LessOrEqual(t, most, perMinute+debt)
		t.Logf("worst minute %d of %d tokens, %d past the budget; its requests' debt %d; the largest single error %d",
			most, perMinute, most-perMinute, debt, largest)
	})
}
