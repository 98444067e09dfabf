package pacing_test

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// orgLimits gives "org-a" a budget of 1,000 tokens a minute, every other
// org starting "org-" 100, and the rest none.
func orgLimits(key string) *pacing.BudgetLimits {
	switch {
	case key == "org-a":
		return &pacing.BudgetLimits{TokensPerMinute: 1000}
	case len(key) > 4 && key[:4] == "org-":
		return &pacing.BudgetLimits{TokensPerMinute: 100}
	}
	return nil
}

func TestBudgetsPerKey(t *testing.T) {
	mock := clock.NewMock()
	s := pacing.NewBudgets(orgLimits, slots.WithClock(mock))

	r, err := s.Reserve("anonymous", pacing.Tokens{Input: 5000})
	assert.NoError(t, err)
	assert.Nil(t, r, "a key without a budget reserves nothing")
	r.Settle(pacing.Tokens{Input: 1}) // a nil Reservation does nothing
	assert.Zero(t, s.Len())

	a, err := s.Reserve("org-a", pacing.Tokens{Input: 600})
	require.NoError(t, err)
	b, err := s.Reserve("org-b", pacing.Tokens{Input: 60})
	require.NoError(t, err)
	_, err = s.Reserve("org-b", pacing.Tokens{Input: 60})
	var le *slots.LimitError
	require.ErrorAs(t, err, &le, "org-b's own budget is 100")
	assert.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, 100, le.Limit)
	assert.Equal(t, 2, s.Len())

	a.Settle(pacing.Tokens{Input: 100, Output: 50}) // 450 back
	assert.Equal(t, 850, s.Status("org-a")[0].Left)
	b.Close() // its estimate stands
	b.Settle(pacing.Tokens{})
	assert.Equal(t, 40, s.Status("org-b")[0].Left, "only the first end counts")
	assert.Nil(t, s.Status("org-c"))
}

// A key's Budget is kept while a reservation of it is open, also past a
// minute (a long stream): the request settles its debt into the Budget
// in use. Idle ones with none open are dropped, so a flood of keys leaves
// nothing behind.
func TestBudgetsKeptWhileOpen(t *testing.T) {
	mock := clock.NewMock()
	s := pacing.NewBudgets(orgLimits, slots.WithClock(mock))
	long, err := s.Reserve("org-a", pacing.Tokens{Input: 10, Output: 100})
	require.NoError(t, err)
	mock.Add(61 * time.Second) // the stream goes on
	for i := range 3000 {
		r, err := s.Reserve(fmt.Sprintf("org-%d", i), pacing.Tokens{Input: 1})
		require.NoError(t, err)
		r.Close()
		if i%1000 == 999 {
			mock.Add(61 * time.Second)
		}
	}
	long.Settle(pacing.Tokens{Input: 10, Output: 900}) // 800 more than estimated
	st := s.Status("org-a")
	require.NotNil(t, st, "kept while its reservation was open")
	assert.Equal(t, 200, st[0].Left, "its debt is charged to the Budget it reserved from")
	assert.Less(t, s.Len(), 2100, "idle keys are dropped")
	// Once idle, with nothing open, it goes with the others.
	mock.Add(61 * time.Second)
	for i := range 2048 {
		r, _ := s.Reserve(fmt.Sprintf("org-x%d", i), pacing.Tokens{Input: 1})
		r.Cancel()
	}
	assert.Nil(t, s.Status("org-a"))
}

// A refused reservation leaves nothing open; reservations made and ended
// on many goroutines leave every Budget droppable.
func TestBudgetsConcurrent(t *testing.T) {
	mock := clock.NewMock()
	s := pacing.NewBudgets(orgLimits, slots.WithClock(mock))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				key := fmt.Sprintf("org-%d", (g*500+i)%40)
				r, err := s.Reserve(key, pacing.Tokens{Input: 7})
				if err != nil {
					continue // over its budget: nothing reserved
				}
				switch i % 3 {
				case 0:
					r.Settle(pacing.Tokens{Input: 3})
				case 1:
					r.Cancel()
				default:
					r.Close()
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 40, s.Len())
	mock.Add(61 * time.Second)
	for i := range 2048 {
		r, _ := s.Reserve(fmt.Sprintf("org-y%d", i), pacing.Tokens{Input: 1})
		r.Close()
	}
	for k := range 40 {
		assert.Nil(t, s.Status(fmt.Sprintf("org-%d", k)), "nothing left open")
	}
}

// A reservation through Budgets allocates what one of a Budget does; a
// key whose limits become nil reserves nothing at once; no function of
// the limits is a programming error.
func TestBudgetsCostAndLimits(t *testing.T) {
	mock := clock.NewMock()
	off := false
	limits := &pacing.BudgetLimits{TokensPerMinute: 1 << 40}
	s := pacing.NewBudgets(func(string) *pacing.BudgetLimits {
		if off {
			return nil
		}
		return limits
	}, slots.WithClock(mock))
	b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1 << 40}, slots.WithClock(mock))
	require.NoError(t, err)
	alone := testing.AllocsPerRun(100, func() {
		r, _ := b.Reserve(pacing.Tokens{Input: 1})
		r.Settle(pacing.Tokens{Input: 1})
	})
	keyed := testing.AllocsPerRun(100, func() {
		r, _ := s.Reserve("org-a", pacing.Tokens{Input: 1})
		r.Settle(pacing.Tokens{Input: 1})
	})
	assert.Equal(t, alone, keyed)
	off = true
	r, err := s.Reserve("org-a", pacing.Tokens{Input: 1})
	assert.NoError(t, err)
	assert.Nil(t, r)
	assert.Panics(t, func() { pacing.NewBudgets[string](nil) })
}

// TestBudgetOptionsAreTyped: budgets of their own take slots.WithClock
// alone; an option they could not honour (a wait's bound, a logger, an
// Observer) does not compile for them. A nil option is ignored.
func TestBudgetOptionsAreTyped(t *testing.T) {
	clockOption := reflect.TypeFor[slots.ClockOption]()
	assert.True(t, reflect.TypeOf(slots.WithClock(nil)).Implements(clockOption))
	for name, o := range map[string]slots.Option{
		"max wait": slots.WithMaxWait(time.Second),
		"logger":   slots.WithLogger(nil),
		"observer": slots.WithObserver(nil),
		"share":    slots.WithShare(slots.PriorityBatch, slots.Share{}),
	} {
		assert.False(t, reflect.TypeOf(o).Implements(clockOption), "%s is no ClockOption", name)
	}
	mock := clock.NewMock()
	b, err := pacing.NewBudget(pacing.BudgetLimits{MaxRequestsPerMinute: 1}, nil, slots.WithClock(mock))
	require.NoError(t, err)
	_, err = b.Reserve(pacing.Tokens{})
	require.NoError(t, err)
	_, err = b.Reserve(pacing.Tokens{})
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	mock.Add(le.RetryAfter)
	_, err = b.Reserve(pacing.Tokens{})
	assert.NoError(t, err, "refilled on the mock's time")
}

// A key's changed limits take effect at its next Reserve, whether or not
// its Budget is idle, counting what started in the last minute against
// them, also while they were all 0 (before, they waited until the Budget
// was dropped, which a program with fewer than 1,024 keys never saw: a plan
// cut from 1,000 tokens a minute to 150 let 200 through in a minute). A
// reservation open across the change settles against the new limits;
// limits all 0 lift the budget; limits that NewBudget refuses are
// Reserve's error, and change nothing.
func TestBudgetsLimitsChangeAtOnce(t *testing.T) {
	mock := clock.NewMock()
	s, set := budgetsOfLimits(mock, &pacing.BudgetLimits{TokensPerMinute: 1000})
	left := func() (int, int) { st := s.Status("org"); require.NotEmpty(t, st); return st[0].Left, st[0].Limit }

	open, err := s.Reserve("org", pacing.Tokens{Input: 100})
	require.NoError(t, err)
	set(&pacing.BudgetLimits{TokensPerMinute: 150}) // the tenant's plan is cut
	_, err = s.Reserve("org", pacing.Tokens{Input: 100})
	var le *slots.LimitError
	require.ErrorAs(t, err, &le, "200 tokens in a minute under a limit of 150")
	assert.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, 150, le.Limit)
	r, err := s.Reserve("org", pacing.Tokens{Input: 50})
	require.NoError(t, err, "the 50 left under the new limit")
	r.Settle(pacing.Tokens{Input: 50})
	open.Settle(pacing.Tokens{Input: 130}) // 30 more than its estimate: debt, against the new limit
	l, lim := left()
	assert.Equal(t, 150, lim)
	assert.Equal(t, -30, l, "the debt")

	set(&pacing.BudgetLimits{TokensPerMinute: -1})
	_, err = s.Reserve("org", pacing.Tokens{Input: 1})
	require.Error(t, err, "a negative limit")
	assert.NotErrorIs(t, err, pacing.ErrOverBudget)
	_, lim = left()
	assert.Equal(t, 150, lim, "refused limits change nothing")

	set(&pacing.BudgetLimits{TokensPerMinute: 1000}) // raised again
	r, err = s.Reserve("org", pacing.Tokens{Input: 500})
	require.NoError(t, err)
	r.Settle(pacing.Tokens{Input: 500})
	l, lim = left()
	assert.Equal(t, 1000, lim)
	assert.Equal(t, 1000-180-500, l, "what started before the changes still counts")

	set(&pacing.BudgetLimits{}) // lifted
	for range 3 {
		r, err = s.Reserve("org", pacing.Tokens{Input: 5000})
		require.NoError(t, err, "no limit")
		r.Settle(pacing.Tokens{Input: 5000})
	}
	set(&pacing.BudgetLimits{TokensPerMinute: 100})
	_, err = s.Reserve("org", pacing.Tokens{Input: 100})
	assert.ErrorIs(t, err, pacing.ErrOverBudget, "what started while it was lifted counts")
	mock.Add(time.Minute + time.Second)
	r, err = s.Reserve("org", pacing.Tokens{Input: 100})
	require.NoError(t, err, "past the minute")
	r.Close()
	_, err = s.Reserve("org", pacing.Tokens{Input: 1})
	assert.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, 1, s.Len())
}
