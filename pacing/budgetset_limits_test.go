package pacing_test

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// budgetsOfLimits returns Budgets on mock whose every key has the limits
// last given to set, from first.
func budgetsOfLimits(mock clock.Clock, first *pacing.BudgetLimits) (s *pacing.Budgets[string], set func(*pacing.BudgetLimits)) {
	var mu sync.Mutex
	limits := first
	set = func(l *pacing.BudgetLimits) { mu.Lock(); limits = l; mu.Unlock() }
	return pacing.NewBudgets(func(string) *pacing.BudgetLimits { mu.Lock(); defer mu.Unlock(); return limits }, slots.WithClock(mock)), set
}

// A reservation open while a key's limits go to all 0 and come back
// settles (Cancel, or an overestimate) into the windows it was charged to,
// which went on counting (before, the windows were made anew: the step
// went negative, and the budget let more than its limit start within the
// minute).
func TestBudgetsLimitsThroughZeroWithAReservationOpen(t *testing.T) {
	mock := clock.NewMock()
	s, set := budgetsOfLimits(mock, &pacing.BudgetLimits{TokensPerMinute: 150})

	open, err := s.Reserve("org", pacing.Tokens{Input: 140}) // in flight across the changes
	require.NoError(t, err)
	set(&pacing.BudgetLimits{}) // lifted for a moment
	r, err := s.Reserve("org", pacing.Tokens{})
	require.NoError(t, err)
	r.Cancel()
	set(&pacing.BudgetLimits{TokensPerMinute: 150}) // and back
	r, err = s.Reserve("org", pacing.Tokens{Input: 10})
	require.NoError(t, err)
	r.Settle(pacing.Tokens{Input: 10})
	open.Cancel() // never served: its 140 go back... into a window that never had them

	st := s.Status("org")
	require.NotEmpty(t, st)
	assert.LessOrEqual(t, st[0].Left, st[0].Limit, "left more than the limit: %+v", st[0])

	started := 10
	for range 10 {
		mock.Add(time.Second)
		r, err := s.Reserve("org", pacing.Tokens{Input: 100})
		if err != nil {
			continue
		}
		r.Settle(pacing.Tokens{Input: 100})
		started += 100
	}
	assert.LessOrEqual(t, started, 150, "tokens started in %v under a limit of 150 a minute", 10*time.Second)
}

// The same through a key whose Budget was made with limits all 0 (a
// Budget with no limit), a reservation open while the limits are set: its
// estimate counts against them until it settles.
func TestBudgetsLimitsFromZeroWithAReservationOpen(t *testing.T) {
	mock := clock.NewMock()
	s, set := budgetsOfLimits(mock, &pacing.BudgetLimits{})

	open, err := s.Reserve("org", pacing.Tokens{Input: 1000})
	require.NoError(t, err)
	set(&pacing.BudgetLimits{TokensPerMinute: 100})
	_, err = s.Reserve("org", pacing.Tokens{Input: 50})
	require.ErrorIs(t, err, pacing.ErrOverBudget, "the open estimate of 1,000 counts")
	open.Settle(pacing.Tokens{Input: 10}) // an overestimate of 990, returned where it was counted
	r, err := s.Reserve("org", pacing.Tokens{Input: 50})
	require.NoError(t, err)
	r.Settle(pacing.Tokens{Input: 50})
	st := s.Status("org")
	require.NotEmpty(t, st)
	assert.LessOrEqual(t, st[0].Left, st[0].Limit, "%+v", st[0])
	_, err = s.Reserve("org", pacing.Tokens{Input: 900})
	assert.ErrorIs(t, err, pacing.ErrOverBudget, "60 + 900 tokens in a minute under a limit of 100")
	assert.Equal(t, 40, st[0].Left)
}

// Reserve, Settle, Cancel, Close, Status and Len of one key while its
// limits change (also through all 0 and a negative), under -race.
func TestBudgetsLimitsChangeConcurrent(t *testing.T) {
	var n atomic.Int64
	lims := []*pacing.BudgetLimits{
		{TokensPerMinute: 1000}, {TokensPerMinute: 150, MaxRequestsPerMinute: 5}, {}, {InputTokensPerMinute: 10}, {TokensPerMinute: -1}, nil,
	}
	s := pacing.NewBudgets(func(k int) *pacing.BudgetLimits {
		if k > 0 {
			return &pacing.BudgetLimits{TokensPerMinute: 10}
		}
		return lims[n.Add(1)%int64(len(lims))]
	})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				key := 0
				if g == 3 {
					key = 1 + i // new keys: pruning
				}
				r, err := s.Reserve(key, pacing.Tokens{Input: 1, Output: 1})
				if err != nil {
					continue
				}
				switch i % 3 {
				case 0:
					r.Settle(pacing.Tokens{Input: 2})
				case 1:
					r.Cancel()
				default:
					r.Close()
				}
				_ = s.Status(0)
				_ = s.Len()
			}
		})
	}
	wg.Wait()
}

// limitsOf is asked under Budgets' lock, one call at a time: limits read
// before a change cannot be applied after it (before, it was asked first,
// and a Reserve that read the limits before a cut, and locked after
// another Reserve had applied the cut, put the old limits back).
func TestBudgetsLimitsAskedOneAtATime(t *testing.T) {
	var inside, most atomic.Int32
	s := pacing.NewBudgets(func(string) *pacing.BudgetLimits {
		n := inside.Add(1)
		defer inside.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		runtime.Gosched() // a window for another call to come in
		return &pacing.BudgetLimits{TokensPerMinute: 1 << 30}
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 200 {
				r, err := s.Reserve(fmt.Sprint("org-", g%3), pacing.Tokens{Input: 1})
				if assert.NoError(t, err) {
					r.Cancel()
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int32(1), most.Load(), "calls of limitsOf at once")
}
