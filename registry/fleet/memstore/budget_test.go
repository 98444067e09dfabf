package memstore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A clock set back 2 s (NTP) after a charge does not move the window
// back: the charge still counts, and a refusal tells when it will fit.
func TestBudgetClockBack(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 500e6)
	s := memstore.NewWithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	b, err := fleet.NewBudget(s, "b", pacing.BudgetLimits{TokensPerMinute: 100}, 0)
	require.NoError(t, err)
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 90})
	require.NoError(t, err)
	mu.Lock()
	now = now.Add(-2 * time.Second)
	mu.Unlock()
	assert.NotPanics(t, func() {
		_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 20})
		assert.ErrorIs(t, err, pacing.ErrOverBudget)
	})
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 90, le.InFlight)
	assert.Greater(t, le.RetryAfter, 60*time.Second, "the 2 s set back, and the minute")
}

// A request that waits 30 s between Reserve and Start is counted from its
// start: 40 s after that, a minute after the reservation, it still counts;
// and its Settle corrects the second it started in.
func TestBudgetStartMovesTheCharge(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	s := memstore.NewWithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	ctx := context.Background()
	b, err := fleet.NewBudget(s, "b", pacing.BudgetLimits{TokensPerMinute: 100}, 0)
	require.NoError(t, err)
	r, err := b.Reserve(ctx, pacing.Tokens{Input: 60})
	require.NoError(t, err)
	advance(30 * time.Second)
	// Start reads this process's clock for the store's: a fake store clock
	// that has jumped 30 s is a request that started in another second.
	require.NoError(t, r.Start(ctx))
	used, err := b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, 60, used[0], "moved, not added")
	advance(40 * time.Second)
	used, err = b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, 60, used[0], "counted from its start")
	require.NoError(t, r.Settle(ctx, pacing.Tokens{Input: 20}))
	used, err = b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, 20, used[0], "settled in the second it started in")
}

// Requests refused together are told to come back spread over the
// refill: each after the ones told before it, by the minute's share their
// tokens take.
func TestBudgetRefusalsSpread(t *testing.T) {
	waits := refusedOnAFullBudget(t, 4, pacing.Tokens{Input: 50})
	for i := 1; i < len(waits); i++ {
		step := waits[i] - waits[i-1]
		assert.InDelta(t, float64(30*time.Second), float64(step), float64(time.Second), "%v", waits)
	}
}

// Status tells the budget as the store's last answer here counted it, for
// metrics: all of it left before any answer (At zero), then each part's limit and what is
// left of it, a refusal's count too; another process's charge shows only
// once this process's next call is answered.
func TestBudgetStatus(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	limits := pacing.BudgetLimits{TokensPerMinute: 1000, OutputTokensPerMinute: 400}
	a, err := fleet.NewBudget(s, "b", limits, 0)
	require.NoError(t, err)
	other, err := fleet.NewBudget(s, "b", limits, 0)
	require.NoError(t, err)
	st := a.Status()
	assert.True(t, st.At.IsZero(), "no answer yet")
	assert.Equal(t, [4]int{1000, 0, 400, 0}, st.Limits)
	assert.Equal(t, [4]int{1000, 0, 400, 0}, st.Left, "nothing counted yet")

	r, err := a.Reserve(ctx, pacing.Tokens{Input: 300, Output: 100})
	require.NoError(t, err)
	st = a.Status()
	assert.False(t, st.At.IsZero())
	assert.Equal(t, [4]int{600, 0, 300, 0}, st.Left, "a part without a limit has nothing left to tell")
	_, err = other.Reserve(ctx, pacing.Tokens{Input: 100, Output: 100})
	require.NoError(t, err)
	assert.Equal(t, [4]int{600, 0, 300, 0}, a.Status().Left, "the other process's charge is not known here yet")
	require.NoError(t, r.Settle(ctx, pacing.Tokens{Input: 300, Output: 400}))
	assert.Equal(t, [4]int{100, 0, -100, 0}, a.Status().Left, "the settlement's answer counts both, the debt below 0")
	_, err = a.Reserve(ctx, pacing.Tokens{Input: 10, Output: 10})
	require.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, [4]int{100, 0, -100, 0}, a.Status().Left, "a refusal's answer counts what is charged")
}

// slowFirstReply answers the first budget call late: the store counts it
// at once, and its reply waits until hold is closed.
type slowFirstReply struct {
	*memstore.Store
	calls   atomic.Int32
	counted chan struct{}
	hold    chan struct{}
}

func (s *slowFirstReply) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	first := s.calls.Add(1) == 1
	res, err := s.Store.Budget(ctx, c)
	if first {
		close(s.counted)
		<-s.hold
	}
	return res, err
}

// An answer that comes after a later call's does not undo it: Status
// keeps the store's latest count.
func TestBudgetStatusKeepsTheLatestCount(t *testing.T) {
	s := &slowFirstReply{Store: memstore.New(), counted: make(chan struct{}), hold: make(chan struct{})}
	b, err := fleet.NewBudget(s, "b", pacing.BudgetLimits{TokensPerMinute: 1000}, 0)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := b.Reserve(context.Background(), pacing.Tokens{Input: 300})
		assert.NoError(t, err)
	}()
	<-s.counted
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 100})
	require.NoError(t, err)
	assert.Equal(t, 600, b.Status().Left[0], "the store counts 400")
	close(s.hold)
	<-done
	assert.Equal(t, 600, b.Status().Left[0], "still: the first call's answer is older")
}

// With no answer for more than the window, Status tells all of the budget
// left: what it counted has left the window since.
func TestBudgetStatusForgetsAnOldCount(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := fleet.NewBudget(memstore.New(), "b", pacing.BudgetLimits{TokensPerMinute: 1000}, 0)
		require.NoError(t, err)
		_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 1000})
		require.NoError(t, err)
		assert.Equal(t, 0, b.Status().Left[0])
		time.Sleep(60 * time.Second)
		assert.Equal(t, 0, b.Status().Left[0], "within the window and its second")
		time.Sleep(2 * time.Second)
		assert.Equal(t, 1000, b.Status().Left[0], "past it")
	})
}

// failingRequests fails every call on a budget's requests record (its key
// ends in "requests" after a byte no name holds).
type failingRequests struct{ *memstore.Store }

func (s failingRequests) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	if strings.HasSuffix(c.Key, "\xffrequests") {
		return driver.BudgetResult{}, errors.New("connection refused")
	}
	return s.Store.Budget(ctx, c)
}

// A reservation whose requests record cannot be reached after its tokens
// were charged takes its tokens back and fails with ErrUnavailable, in an
// *UnavailableError that says to come back after the Registry's default
// probe interval (250 ms, spread to 375 ms): a Budget keeps no record of
// an outage.
func TestBudgetRequestsUnreachable(t *testing.T) {
	s := memstore.New()
	b, err := fleet.NewBudget(failingRequests{s}, "b", pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10}, 0)
	require.NoError(t, err)
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 300})
	require.ErrorIs(t, err, fleet.ErrUnavailable)
	var down *fleet.UnavailableError
	require.ErrorAs(t, err, &down)
	assert.GreaterOrEqual(t, down.RetryAfter(), 250*time.Millisecond)
	assert.LessOrEqual(t, down.RetryAfter(), 375*time.Millisecond)
	assert.Equal(t, `fleet: store unavailable: budget "b": connection refused`, err.Error())
	tokens, err := fleet.NewBudget(s, "b", pacing.BudgetLimits{TokensPerMinute: 1000}, 0)
	require.NoError(t, err)
	used, err := tokens.Used(context.Background())
	require.NoError(t, err)
	assert.Equal(t, [4]int{}, used, "the tokens charged were taken back")
}

// Status tells a requests budget beside the tokens', each part as the
// latest answer on its record counted it.
func TestBudgetStatusOfRequests(t *testing.T) {
	ctx := context.Background()
	b, err := fleet.NewBudget(memstore.New(), "b", pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 5}, 0)
	require.NoError(t, err)
	assert.Equal(t, [4]int{1000, 0, 0, 5}, b.Status().Left)
	r, err := b.Reserve(ctx, pacing.Tokens{Input: 100})
	require.NoError(t, err)
	_, err = b.Reserve(ctx, pacing.Tokens{})
	require.NoError(t, err)
	st := b.Status()
	assert.Equal(t, [4]int{1000, 0, 0, 5}, st.Limits)
	assert.Equal(t, [4]int{900, 0, 0, 3}, st.Left)
	left, limits := r.Left()
	assert.Equal(t, 900, left[0])
	assert.Equal(t, 4, left[3], "as the reservation's own answer counted it")
	assert.Equal(t, 5, limits[3])
	require.NoError(t, r.Cancel(ctx))
	assert.Equal(t, [4]int{1000, 0, 0, 4}, b.Status().Left)

	only, err := fleet.NewBudget(memstore.New(), "only", pacing.BudgetLimits{MaxRequestsPerMinute: 1}, 0)
	require.NoError(t, err)
	_, err = only.Reserve(ctx, pacing.Tokens{Input: 1 << 20})
	require.NoError(t, err, "no token budget: tokens are not counted")
	_, err = only.Reserve(ctx, pacing.Tokens{Input: 1})
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, pacing.CapMaxRequestsPerMinute, le.Cap)
	_, err = only.Reserve(ctx, pacing.Tokens{Input: -1})
	assert.ErrorIs(t, err, slots.ErrBadUnits)
}

// A reservation of zero Tokens (its tokens not counted) that is settled
// with what its request used is charged that usage, as pacing.Budget
// charges it; cancelled, it charges nothing.
func TestBudgetZeroTokensSettled(t *testing.T) {
	ctx := context.Background()
	limits := pacing.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 5}
	local, err := pacing.NewBudget(limits)
	require.NoError(t, err)
	lr, err := local.Reserve(pacing.Tokens{})
	require.NoError(t, err)
	lr.Settle(pacing.Tokens{Input: 500})
	_, err = local.Reserve(pacing.Tokens{Input: 1})
	assert.ErrorIs(t, err, pacing.ErrOverBudget, "in one process")

	b, err := fleet.NewBudget(memstore.New(), "b", limits, 0)
	require.NoError(t, err)
	r, err := b.Reserve(ctx, pacing.Tokens{})
	require.NoError(t, err)
	require.NoError(t, r.Settle(ctx, pacing.Tokens{Input: 500}))
	used, err := b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{500, 500, 0, 1}, used)
	_, err = b.Reserve(ctx, pacing.Tokens{Input: 1})
	assert.ErrorIs(t, err, pacing.ErrOverBudget, "across the fleet")

	c, err := b.Reserve(ctx, pacing.Tokens{})
	require.NoError(t, err)
	require.NoError(t, c.Cancel(ctx))
	used, err = b.Used(ctx)
	require.NoError(t, err)
	assert.Equal(t, [4]int{500, 500, 0, 1}, used, "cancelled: nothing")
}

// A nil context is context.Background to a Budget's calls, refusals
// included: a refusal that takes back an earlier record's charge, alone
// or under ReserveAll, panicked making that charge's context of its own.
func TestBudgetNilContext(t *testing.T) {
	b, err := fleet.NewBudget(memstore.New(), "b", pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 1}, 0)
	require.NoError(t, err)
	//lint:ignore SA1012 a nil context, on purpose
	r, err := b.Reserve(nil, pacing.Tokens{Input: 80})
	require.NoError(t, err)
	require.NoError(t, r.Settle(context.Background(), pacing.Tokens{Input: 80}))
	//lint:ignore SA1012 a nil context, on purpose
	_, err = b.Reserve(nil, pacing.Tokens{Input: 80}) // the tokens taken, then refused by the requests
	assert.ErrorIs(t, err, pacing.ErrOverBudget)
	//lint:ignore SA1012 a nil context, on purpose
	_, _, err = fleet.ReserveAll(nil, pacing.Tokens{Input: 80}, nil, b)
	assert.ErrorIs(t, err, pacing.ErrOverBudget)
	used, err := b.Used(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 80, used[0], "the refused requests' tokens taken back")
}

// A client that asks again and again without waiting books a return each
// time, but the returns told count at most eight budgets' worth, and a
// request larger than the budget one budget (it needs one empty minute):
// the next client is told to come back within eight minutes and a little
// more, not after every booking.
func TestBudgetRefusalFloodIsBounded(t *testing.T) {
	told := refusedOnAFullBudget(t, 500, pacing.Tokens{Input: 1000})
	t.Logf("told %v, %v ... %v", told[0], told[1], told[len(told)-1])
	assert.InDelta(t, float64(time.Minute), float64(told[1]-told[0]), float64(time.Second), "a request of ten budgets' worth takes one minute of the refill")
	assert.LessOrEqual(t, told[len(told)-1], 10*time.Minute)
}

// refusedOnAFullBudget returns what n requests costing t, refused one
// after another by a budget of 100 tokens a minute that one request has
// just filled, were told.
func refusedOnAFullBudget(t *testing.T, n int, cost pacing.Tokens) (told []time.Duration) {
	ctx := context.Background()
	b, err := fleet.NewBudget(memstore.New(), "b", pacing.BudgetLimits{TokensPerMinute: 100}, 0)
	require.NoError(t, err)
	_, err = b.Reserve(ctx, pacing.Tokens{Input: 100})
	require.NoError(t, err)
	for range n {
		_, err := b.Reserve(ctx, cost)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		told = append(told, le.RetryAfter)
	}
	return told
}

// countingStore counts the calls made on its budgets.
type countingStore struct {
	*memstore.Store
	calls atomic.Int32
}

func (s *countingStore) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	s.calls.Add(1)
	return s.Store.Budget(ctx, c)
}

// A request that its budget refuses costs the store one call, the charge
// refused: it had nothing to take back. (Its Reserve sent a second, a
// correction of its whole estimate in no second, which the store drops:
// twice the calls while a spent budget refuses every request, and, with a
// store that hangs, a refusal that waited the whole timeout for it.)
func TestBudgetRefusalMakesOneCall(t *testing.T) {
	s := &countingStore{Store: memstore.New()}
	b, err := fleet.NewBudget(s, "b", pacing.BudgetLimits{TokensPerMinute: 100}, 0)
	require.NoError(t, err)
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 100})
	require.NoError(t, err)
	s.calls.Store(0)
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 10})
	require.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, int32(1), s.calls.Load(), "the charge refused, and nothing more")
}

// A store's clock set back (a failover to a host whose clock is behind)
// does not freeze Status: an answer that comes after another, with a time
// earlier than the other's by more than a call can take, is the later
// one. (It was taken for an answer that a later one had overtaken: Status
// kept the count from before the clock went back, then, a minute on,
// told all of the budget left, until the store's clock caught up.)
func TestBudgetStatusAfterTheStoreClockWentBack(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	s := memstore.NewWithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	b, err := fleet.NewBudget(s, "b", pacing.BudgetLimits{TokensPerMinute: 1000}, 0)
	require.NoError(t, err)
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 900})
	require.NoError(t, err)
	assert.Equal(t, 100, b.Status().Left[0])
	mu.Lock()
	now = now.Add(-5 * time.Minute)
	mu.Unlock()
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 50})
	require.NoError(t, err, "the store counts 900: 50 more fit")
	assert.Equal(t, 50, b.Status().Left[0], "the store's latest count, 950")
}

// lateReply makes each charge at once and holds its reply until hold is
// closed, or the call's context ends: a store slow to answer.
type lateReply struct {
	*memstore.Store
	hold chan struct{}
}

func (s *lateReply) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	res, err := s.Store.Budget(context.WithoutCancel(ctx), c)
	if c.Correct {
		return res, err
	}
	select {
	case <-s.hold:
		return res, err
	case <-ctx.Done():
		return driver.BudgetResult{}, ctx.Err()
	}
}

// A Reserve given up by its caller while the store had the charges but
// had not answered returns the context's error at once, and charges
// nothing once the store answers: each charge made is taken back, the
// requests record's too. (They stood for the rest of the minute.)
func TestBudgetReserveGivenUpTakesBackLateCharges(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		s := &lateReply{Store: memstore.New(), hold: make(chan struct{})}
		b, err := fleet.NewBudget(s, "b", pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10}, time.Second)
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = b.Reserve(ctx, pacing.Tokens{Input: 600})
		require.ErrorIs(t, err, context.DeadlineExceeded)
		close(s.hold)
		synctest.Wait()
		used, err := b.Used(context.Background())
		require.NoError(t, err)
		assert.Equal(t, [4]int{}, used, "the request was never sent")
	})
}

// panickingBudgets is a store whose budget calls panic: a client's bug.
type panickingBudgets struct{ *memstore.Store }

func (panickingBudgets) Budget(context.Context, *driver.BudgetCall) (driver.BudgetResult, error) {
	panic("a client's bug")
}

// A store that panics in a charge made for a caller whose context can end
// (made on a goroutine of its own) fails the charge, as the Registry's
// calls fail: it does not end the process, which no caller can recover.
func TestBudgetStorePanicIsAnError(t *testing.T) {
	b, err := fleet.NewBudget(panickingBudgets{memstore.New()}, "b", pacing.BudgetLimits{TokensPerMinute: 100}, 0)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = b.Reserve(ctx, pacing.Tokens{Input: 1})
	require.ErrorIs(t, err, fleet.ErrUnavailable)
	assert.ErrorContains(t, err, "a client's bug")
	_, err = b.Reserve(context.Background(), pacing.Tokens{Input: 1})
	require.ErrorIs(t, err, fleet.ErrUnavailable, "the same without a goroutine")
}
