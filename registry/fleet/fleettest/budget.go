package fleettest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
)

// budgets returns the budget name with limits as each of n processes of
// the fleet fleetName on srv sees it.
func budgets(t *testing.T, srv Server, fleetName, name string, limits upstream.BudgetLimits, n int) []*fleet.Budget {
	t.Helper()
	bs := make([]*fleet.Budget, n)
	for i := range bs {
		b, err := fleet.NewBudget(srv.Store(t, fleetName), name, limits, 5*time.Second)
		require.NoError(t, err)
		bs[i] = b
	}
	return bs
}

// budgetShared: a budget per minute is the fleet's. What one process
// charges the others see; a charge over it is refused with when it would
// fit (within the minute and a second) and charges nothing; what a
// request did not use comes back, a cancelled one all of it; its first
// request passes, however large; and processes reserving at once never
// charge it past its limit, counted apart from the store.
func budgetShared(t *testing.T, srv Server) {
	ctx := context.Background()
	name := "budgets"
	bs := budgets(t, srv, name, "provider", upstream.BudgetLimits{TokensPerMinute: 1000, OutputTokensPerMinute: 400}, 2)
	a, b := bs[0], bs[1]

	ra, err := a.Reserve(ctx, upstream.Tokens{Input: 300, Output: 300})
	require.NoError(t, err)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 100, Output: 200})
	require.ErrorIs(t, err, upstream.ErrOverBudget, "the other process sees the output budget's 300")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, upstream.CapOutputTokensPerMinute, le.Cap)
	assert.Equal(t, 300, le.InFlight)
	assert.Equal(t, 400, le.Limit)
	assert.Greater(t, le.RetryAfter, 58*time.Second)
	assert.LessOrEqual(t, le.RetryAfter, 61*time.Second)
	used, err := b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{600, 300, 300, 0}, used, "the refusal charged nothing")

	require.NoError(t, ra.Settle(ctx, upstream.Tokens{Input: 300, Output: 50}))
	rb, err := b.Reserve(ctx, upstream.Tokens{Input: 100, Output: 200})
	require.NoError(t, err, "what the first did not use came back")
	require.NoError(t, rb.Cancel(ctx))
	used, err = a.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{350, 300, 50, 0}, used)

	// Start moves a charge to the second its request starts in: in the
	// second it was reserved in, it changes nothing.
	rs, err := a.Reserve(ctx, upstream.Tokens{Input: 10})
	require.NoError(t, err)
	require.NoError(t, rs.Start(ctx))
	used, err = b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{360, 310, 50, 0}, used, "moved, not added")
	require.NoError(t, rs.Cancel(ctx))
	// The store's move, as the contract says: from a second with no
	// charge, it only adds to the current one; from the current one,
	// nothing.
	st := srv.Store(t, name)
	call := &driver.BudgetCall{Key: "moves", Limits: [3]int64{100}, Cost: [3]int64{10, 10}}
	res, err := st.Budget(ctx, call)
	require.NoError(t, err)
	require.True(t, res.Charged)
	move := &driver.BudgetCall{Key: "moves", Limits: [3]int64{100}, Cost: [3]int64{10, 10}, Correct: true, Move: true, Step: res.Step - 1}
	res2, err := st.Budget(ctx, move)
	require.NoError(t, err)
	if res2.Step == res.Step { // the second did not turn meanwhile
		assert.Equal(t, [3]int64{20, 20, 0}, res2.Used, "added to the current second, nothing to take")
		move.Step = res2.Step
		res3, err := st.Budget(ctx, move)
		require.NoError(t, err)
		assert.Equal(t, res2.Used, res3.Used, "a move within the second changes nothing")
	}

	big := budgets(t, srv, name, "first", upstream.BudgetLimits{TokensPerMinute: 100}, 1)[0]
	_, err = big.Reserve(ctx, upstream.Tokens{Input: 5000})
	require.NoError(t, err, "a budget's first request passes, however large")
	_, err = big.Reserve(ctx, upstream.Tokens{Input: 1})
	assert.ErrorIs(t, err, upstream.ErrOverBudget)

	const limit, cost = 2000, 7
	hammer := budgets(t, srv, name, "hammer", upstream.BudgetLimits{TokensPerMinute: limit}, 2)
	charged := cost * reserveAtOnce(t, hammer, 60, upstream.Tokens{Input: cost})
	used, err = hammer[0].Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, charged, used[0], "the store counts what was charged")
	assert.LessOrEqual(t, charged, limit)
	assert.Greater(t, charged, limit-cost, "refused only once the next could not fit")
	t.Logf("8 reservers on 2 processes charged %d of %d", charged, limit)
}

// budgetRequests: a budget's requests per minute (MaxRequestsPerMinute)
// are the fleet's too, counted one per request whatever its tokens (none
// counted: the requests alone); a request the requests budget refuses
// charges none of its tokens either; a cancelled one is not counted, a
// settled one stays; processes reserving at once never pass the limit.
func budgetRequests(t *testing.T, srv Server) {
	ctx := context.Background()
	name := "requests"
	bs := budgets(t, srv, name, "provider", upstream.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 3}, 2)
	a, b := bs[0], bs[1]
	var held []*fleet.BudgetReservation
	for _, cost := range []upstream.Tokens{{Input: 100}, {}, {Input: 50, Output: 50}} {
		r, err := a.Reserve(ctx, cost)
		require.NoError(t, err)
		held = append(held, r)
	}
	used, err := b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{200, 150, 50, 3}, used, "three requests; the one of no tokens counted charged none")

	_, err = b.Reserve(ctx, upstream.Tokens{Input: 10})
	require.ErrorIs(t, err, upstream.ErrOverBudget)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, upstream.CapMaxRequestsPerMinute, le.Cap)
	assert.Equal(t, 3, le.InFlight)
	assert.Equal(t, 3, le.Limit)
	assert.Greater(t, le.RetryAfter, 58*time.Second)
	assert.LessOrEqual(t, le.RetryAfter, 61*time.Second)
	used, err = a.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{200, 150, 50, 3}, used, "refused: its tokens were taken back")

	require.NoError(t, held[0].Settle(ctx, upstream.Tokens{Input: 20}))
	require.NoError(t, held[1].Cancel(ctx))
	used, err = b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{120, 70, 50, 2}, used, "settled: still a request; cancelled: none")
	r, err := b.Reserve(ctx, upstream.Tokens{})
	require.NoError(t, err, "the cancelled request's place is free")
	assert.Equal(t, 0, func() int { left, _ := r.Left(); return left[3] }())

	const limit, cost = 40, 7
	hammer := budgets(t, srv, name, "hammer", upstream.BudgetLimits{TokensPerMinute: 100_000, MaxRequestsPerMinute: limit}, 2)
	admitted := reserveAtOnce(t, hammer, 10, upstream.Tokens{Input: cost})
	used, err = hammer[0].Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, limit, admitted, "80 asked: exactly the limit admitted")
	assert.Equal(t, [4]int{limit * cost, limit * cost, 0, limit}, used, "the refused took back their tokens")
}

// reserveAtOnce has 8 goroutines, spread over the processes' budgets bs,
// each reserve cost n times, and returns how many reservations were
// charged; every other must be refused for the budget.
func reserveAtOnce(t *testing.T, bs []*fleet.Budget, n int, cost upstream.Tokens) int {
	var mu sync.Mutex
	charged := 0
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range n {
				_, err := bs[g%len(bs)].Reserve(context.Background(), cost)
				if err == nil {
					mu.Lock()
					charged++
					mu.Unlock()
				} else if !assert.ErrorIs(t, err, upstream.ErrOverBudget) {
					return
				}
			}
		})
	}
	wg.Wait()
	return charged
}

// budgetCorrectionsFloor: a correction takes no step's part below zero,
// so a store that lost its data (or a client that gives back more than it
// charged) cannot leave the window counting less than nothing, which a
// budget would take for an empty one and fill again. A correction or a
// move of nothing writes nothing.
func budgetCorrectionsFloor(t *testing.T, srv Server) {
	ctx := context.Background()
	st := srv.Store(t, "floor")
	call := func(c driver.BudgetCall) driver.BudgetResult {
		t.Helper()
		res, err := st.Budget(ctx, &c)
		require.NoError(t, err)
		return res
	}
	limits := [3]int64{100}
	res := call(driver.BudgetCall{Key: "k", Limits: limits, Cost: [3]int64{60, 60}})
	require.True(t, res.Charged)
	s := res.Step
	res = call(driver.BudgetCall{Key: "k", Limits: limits, Cost: [3]int64{-200, -200, -50}, Correct: true, Step: s})
	assert.Equal(t, [3]int64{0, 0, 0}, res.Used, "no more than was charged comes back")
	res = call(driver.BudgetCall{Key: "k", Limits: limits, Cost: [3]int64{-30, -30}, Correct: true, Step: s - 1})
	assert.Equal(t, [3]int64{0, 0, 0}, res.Used, "nothing comes back from a second never charged")
	res = call(driver.BudgetCall{Key: "k", Limits: limits, Cost: [3]int64{}, Correct: true, Move: true, Step: s - 2})
	assert.Equal(t, [3]int64{0, 0, 0}, res.Used, "a move of nothing")

	// The window is empty: a charge of the whole limit fits, one more does not.
	res = call(driver.BudgetCall{Key: "k", Limits: limits, Cost: [3]int64{100, 100}})
	require.True(t, res.Charged)
	res = call(driver.BudgetCall{Key: "k", Limits: limits, Cost: [3]int64{1, 1}})
	assert.False(t, res.Charged, "the limit is spent: nothing was counted below zero")
	assert.Equal(t, [3]int64{100, 100, 0}, res.Used)
}

// budgetCheck: a check (driver.BudgetCall's Check) charges nothing and
// answers as a charge's refusal would, on the window as it is: when the
// cost would fit and the part that binds then, or that it fits now (At
// not after Now). A budget's first request fits, however large.
func budgetCheck(t *testing.T, srv Server) {
	ctx := context.Background()
	st := srv.Store(t, "check")
	call := func(c driver.BudgetCall) driver.BudgetResult {
		t.Helper()
		res, err := st.Budget(ctx, &c)
		require.NoError(t, err)
		return res
	}
	check := func(cost [3]int64) driver.BudgetResult {
		t.Helper()
		return call(driver.BudgetCall{Key: "k", Limits: [3]int64{100, 0, 50}, Cost: cost, Check: true})
	}
	res := check([3]int64{500, 0, 500})
	assert.False(t, res.Charged)
	assert.LessOrEqual(t, res.At, res.Now, "an empty budget takes any cost")
	assert.Equal(t, [3]int64{}, res.Used)

	res = call(driver.BudgetCall{Key: "k", Limits: [3]int64{100, 0, 50}, Cost: [3]int64{60, 60, 30}})
	require.True(t, res.Charged)
	s := res.Step
	res = check([3]int64{30, 30, 10})
	assert.False(t, res.Charged, "fits, but a check charges nothing")
	assert.LessOrEqual(t, res.At, res.Now, "fits now")
	assert.Equal(t, [3]int64{60, 60, 30}, res.Used)
	for _, c := range []struct {
		cost    [3]int64
		binding int
	}{{[3]int64{50, 50, 0}, 0}, {[3]int64{10, 0, 30}, 2}, {[3]int64{50, 0, 30}, 0}} {
		res = check(c.cost)
		assert.False(t, res.Charged, "%v", c.cost)
		assert.Equal(t, (s+driver.BudgetSteps+1)*1000, res.At, "%v: when the charge's second leaves the window", c.cost)
		assert.Greater(t, res.At, res.Now)
		assert.Equal(t, c.binding, res.Binding, "%v", c.cost)
		assert.GreaterOrEqual(t, res.Step, s)
		assert.Equal(t, [3]int64{60, 60, 30}, res.Used, "%v", c.cost)
		refused := call(driver.BudgetCall{Key: "k", Limits: [3]int64{100, 0, 50}, Cost: c.cost})
		assert.False(t, refused.Charged, "%v", c.cost)
		assert.Equal(t, []int64{res.At, int64(res.Binding)}, []int64{refused.At, int64(refused.Binding)}, "%v: as the charge's refusal", c.cost)
	}
	res = call(driver.BudgetCall{Key: "k", Limits: [3]int64{100, 0, 50}, Cost: [3]int64{40, 40, 20}})
	assert.True(t, res.Charged, "the checks charged nothing: the rest of the limit fits")
	assert.Equal(t, [3]int64{100, 100, 50}, res.Used)
}

// budgetLost: reservations still open when the store lost its data are
// cancelled after it; the budget then admits no more than its limit in
// the minute (the cancels gave back what the store had forgotten, and the
// window counted less than nothing: twice the limit was admitted).
func budgetLost(t *testing.T, srv Server) {
	f, ok := srv.(Faults)
	if !ok {
		t.Skip("no Faults")
	}
	ctx := context.Background()
	b := budgets(t, srv, "budget-lost", "provider", upstream.BudgetLimits{TokensPerMinute: 1000}, 1)[0]
	var open []*fleet.BudgetReservation
	for range 10 {
		r, err := b.Reserve(ctx, upstream.Tokens{Input: 100})
		require.NoError(t, err)
		open = append(open, r)
	}
	f.Lose()
	for _, r := range open {
		require.NoError(t, r.Cancel(ctx))
	}
	admitted := 0
	for range 30 {
		if _, err := b.Reserve(ctx, upstream.Tokens{Input: 100}); err == nil {
			admitted++
		} else {
			require.ErrorIs(t, err, upstream.ErrOverBudget)
		}
	}
	assert.Equal(t, 10, admitted, "1,000 tokens a minute, 100 a request")
}
