package pacing_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A keyed Budget's request that runs past the minute settles into the
// Budget it reserved from: its underestimate is charged as debt in the
// minute it ends, its overestimate needs no return, and the key's Budget
// is kept while that debt counts, many other keys coming and going.
func TestKeyedBudgetDebtAfterTheMinute(t *testing.T) {
	mock := clock.NewMock()
	limits := pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 5}
	bs := pacing.NewBudgets(func(string) *pacing.BudgetLimits { return &limits }, slots.WithClock(mock))
	long, err := bs.Reserve("a", pacing.Tokens{Input: 100})
	require.NoError(t, err)
	over, err := bs.Reserve("a", pacing.Tokens{Input: 500})
	require.NoError(t, err)
	mock.Add(30 * time.Second)
	require.NoError(t, long.Start())
	require.NoError(t, over.Start())
	mock.Add(70 * time.Second)
	long.Settle(pacing.Tokens{Input: 700})
	over.Settle(pacing.Tokens{Input: 10})
	left := leftOf(bs.Status("a"))
	assert.Equal(t, 1000-600, left["//tokens_per_minute"], "the 600 underestimated, as debt now")
	assert.Equal(t, 5, left["//max_requests_per_minute"], "its request counted in its own minute, gone")
	for i := range 3000 {
		r, err := bs.Reserve(fmt.Sprintf("k%d", i), pacing.Tokens{Input: 1})
		require.NoError(t, err)
		r.Cancel()
	}
	left = leftOf(bs.Status("a"))
	assert.Equal(t, 400, left["//tokens_per_minute"], "the debt still counts: the Budget kept")
	_, err = bs.Reserve("a", pacing.Tokens{Input: 500})
	require.Error(t, err, "500 does not fit 400")
	mock.Add(61 * time.Second)
	r, err := bs.Reserve("a", pacing.Tokens{Input: 5000})
	require.NoError(t, err, "the minute empty: its first request passes")
	r.Close()
}
