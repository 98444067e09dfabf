package pacing_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A Budget on its own takes a request now or refuses it with when it will
// take it; settling returns an overestimate, cancelling all of it; its
// first request passes however large, and it is idle a minute after.
func TestBudgetStandalone(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000, OutputTokensPerMinute: 300})
		require.NoError(t, err)
		assert.True(t, b.Idle())
		r1, err := b.Reserve(pacing.Tokens{Input: 500, Output: 200})
		require.NoError(t, err)
		_, err = b.Reserve(pacing.Tokens{Input: 10, Output: 200})
		require.ErrorIs(t, err, pacing.ErrOverBudget)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapOutputTokensPerMinute, le.Cap)
		assert.Equal(t, 200, le.InFlight)
		assert.Equal(t, 300, le.Limit)
		assert.Greater(t, le.RetryAfter, 59*time.Second)
		assert.LessOrEqual(t, le.RetryAfter, 61*time.Second)

		r1.Settle(pacing.Tokens{Input: 500, Output: 20}) // the answer was short
		r2, err := b.Reserve(pacing.Tokens{Input: 10, Output: 200})
		require.NoError(t, err, "the overestimate came back")
		r2.Cancel()
		r2.Settle(pacing.Tokens{Input: 10, Output: 200}) // only the first counts
		st := b.Status()
		require.Len(t, st, 2)
		assert.Equal(t, pacing.BudgetStatus{Cap: pacing.CapTokensPerMinute, Limit: 1000, Left: 480, ResetIn: st[0].ResetIn}, st[0])
		assert.Equal(t, 280, st[1].Left)
		var none *pacing.Reservation
		none.Settle(pacing.Tokens{Input: 1}) // a no-op

		time.Sleep(61 * time.Second)
		assert.True(t, b.Idle())
		big, err := b.Reserve(pacing.Tokens{Input: 5000})
		require.NoError(t, err, "a first request passes, however large")
		big.Settle(pacing.Tokens{Input: 5000})
		_, err = b.Reserve(pacing.Tokens{Input: 1})
		assert.ErrorIs(t, err, pacing.ErrOverBudget)

		_, err = b.Reserve(pacing.Tokens{Input: slots.MaxUnits, Output: 1})
		assert.ErrorIs(t, err, slots.ErrBadUnits)
		_, err = pacing.NewBudget(pacing.BudgetLimits{InputTokensPerMinute: -1})
		assert.ErrorContains(t, err, "input_tokens_per_minute: -1 is negative")
	})
}

// Many goroutines reserving and settling at once, counted apart from the
// Budget: what starts within the minute never passes the budget (each
// settles exactly what it estimated), and every reservation is counted.
func TestBudgetStandaloneHammer(t *testing.T) {
	b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 50_000})
	require.NoError(t, err)
	var mu sync.Mutex
	taken, refused := 0, 0
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 500 {
				n := 1 + (i*500+j)%97
				r, err := b.Reserve(pacing.Tokens{Input: n})
				mu.Lock()
				if err == nil {
					taken += n
				} else {
					refused++
				}
				mu.Unlock()
				if err == nil && j%2 == 0 {
					r.Settle(pacing.Tokens{Input: n})
				}
			}
		})
	}
	wg.Wait()
	// The run takes far less than a minute: all it took is in one window.
	assert.LessOrEqual(t, taken, 50_000)
	assert.Greater(t, taken, 50_000-97, "refused only when the next could not fit")
	assert.Positive(t, refused)
	assert.Equal(t, 50_000-taken, b.Status()[0].Left)
}
