package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// used returns what b counts in its last minute: all tokens, and requests.
func used(t *testing.T, b *fleet.Budget) (tokens, requests int) {
	t.Helper()
	u, err := b.Used(context.Background())
	require.NoError(t, err)
	return u[0], u[3]
}

func newBudget(t *testing.T, s driver.Store, name string, limits upstream.BudgetLimits) *fleet.Budget {
	t.Helper()
	b, err := fleet.NewBudget(s, name, limits, 0)
	require.NoError(t, err)
	return b
}

// ReserveAll is all or nothing: once all Budgets take the request,
// Start, Settle and Cancel reach each of them; a Budget that refuses
// (named by its index among the arguments, nil ones counted) leaves
// nothing charged in those reserved before it.
func TestReserveAll(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	provider := newBudget(t, s, "provider", upstream.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10})
	model := newBudget(t, s, "model", upstream.BudgetLimits{TokensPerMinute: 100})

	rs, i, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 60, Output: 20}, nil, provider, nil, model)
	require.NoError(t, err)
	assert.Equal(t, -1, i)
	require.Len(t, rs.Reserved(), 2)
	left, limits := rs.Reserved()[1].Left()
	assert.Equal(t, 20, left[0], "the model's budget: 100 less 80")
	assert.Equal(t, 100, limits[0])
	require.NoError(t, rs.Start(ctx))
	require.NoError(t, rs.Settle(ctx, upstream.Tokens{Input: 60, Output: 5}))
	tokens, requests := used(t, provider)
	assert.Equal(t, []int{65, 1}, []int{tokens, requests}, "settled in the provider's budget")
	tokens, _ = used(t, model)
	assert.Equal(t, 65, tokens, "and in the model's")

	_, i, err = fleet.ReserveAll(ctx, upstream.Tokens{Input: 50}, nil, provider, nil, model)
	require.ErrorIs(t, err, upstream.ErrOverBudget)
	assert.Equal(t, 2, i, "the model's budget refused: 65 + 50 over 100")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 100, le.Limit)
	tokens, requests = used(t, provider)
	assert.Equal(t, []int{65, 1}, []int{tokens, requests}, "the provider's charge went back, its request too")

	rs, _, err = fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, provider, model)
	require.NoError(t, err)
	require.NoError(t, rs.Cancel(ctx))
	tokens, requests = used(t, provider)
	assert.Equal(t, []int{65, 1}, []int{tokens, requests}, "a cancelled request charges nothing")
	tokens, _ = used(t, model)
	assert.Equal(t, 65, tokens)
}

// A Budget whose store cannot be reached refuses the request, unless the
// caller lets it through uncounted: then it is told, and the request is
// reserved of the other Budgets alone.
func TestReserveAllUnavailable(t *testing.T) {
	ctx := context.Background()
	up, down := memstore.New(), memstore.New()
	provider := newBudget(t, up, "provider", upstream.BudgetLimits{TokensPerMinute: 1000})
	tenant := newBudget(t, down, "tenant", upstream.BudgetLimits{TokensPerMinute: 1000})
	down.Kill()

	_, i, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, provider, tenant)
	require.ErrorIs(t, err, fleet.ErrUnavailable)
	assert.Equal(t, 1, i)
	tokens, _ := used(t, provider)
	assert.Zero(t, tokens, "nothing left charged")

	var told []int
	rs, i, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, func(i int, err error) {
		assert.ErrorIs(t, err, fleet.ErrUnavailable)
		told = append(told, i)
	}, provider, tenant)
	require.NoError(t, err)
	assert.Equal(t, -1, i)
	assert.Equal(t, []int{1}, told)
	assert.Len(t, rs.Reserved(), 1, "the provider's alone")
	tokens, _ = used(t, provider)
	assert.Equal(t, 10, tokens)

	var none *fleet.Reservations
	assert.NoError(t, none.Settle(ctx, upstream.Tokens{Input: 1}), "a nil Reservations does nothing")
	assert.NoError(t, none.Cancel(ctx))
	assert.Empty(t, none.Reserved())
}

// A refusal stops ReserveAll where it is, and refuses whatever uncounted
// says: an over-budget refusal at the first Budget charges nothing in the
// others, and tells uncounted nothing.
func TestReserveAllStopsAtARefusal(t *testing.T) {
	ctx := context.Background()
	s := memstore.New()
	model := newBudget(t, s, "model", upstream.BudgetLimits{TokensPerMinute: 100})
	provider := newBudget(t, s, "provider", upstream.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10})
	_, _, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 100}, nil, model) // a budget's first request passes, however large
	require.NoError(t, err)
	_, i, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 50}, func(int, error) { t.Error("uncounted told of an over-budget refusal") },
		model, provider)
	require.ErrorIs(t, err, upstream.ErrOverBudget)
	assert.Equal(t, 0, i)
	tokens, requests := used(t, provider)
	assert.Equal(t, []int{0, 0}, []int{tokens, requests}, "the provider's budget charged nothing (asked, it had room)")
}

// endingStore is a memstore that, at a charge of the budget key, runs
// ending, makes the charge and holds its reply until release is closed
// (or the call's context ends): the caller's context ends while the store
// has the call, as a server that was sent it makes it.
type endingStore struct {
	*memstore.Store
	key     string
	ending  func()
	made    chan struct{} // closed once the charge is made
	release chan struct{}
}

func (s endingStore) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	if c.Key != s.key || c.Correct {
		return s.Store.Budget(ctx, c)
	}
	s.ending()
	res, err := s.Store.Budget(context.WithoutCancel(ctx), c) // the server has the call: it makes it
	close(s.made)
	select {
	case <-s.release:
		return res, err
	case <-ctx.Done():
		return driver.BudgetResult{}, ctx.Err()
	}
}

// The reservations made are cancelled whether the caller's context has
// ended (here, just after the first Budget took the request, while the
// second's store had the call) or uncounted panics; the second's charge,
// made once the caller had gone, is taken back when its reply comes.
func TestReserveAllCancelsAfterTheEnd(t *testing.T) {
	t.Run("context ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		s := endingStore{Store: memstore.New(), key: "model", ending: cancel, made: make(chan struct{}), release: make(chan struct{})}
		provider := newBudget(t, s, "provider", upstream.BudgetLimits{TokensPerMinute: 1000})
		model := newBudget(t, s, "model", upstream.BudgetLimits{TokensPerMinute: 1000})
		_, i, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, provider, model)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 1, i)
		tokens, _ := used(t, provider)
		assert.Zero(t, tokens, "the provider's charge went back")
		<-s.made
		tokens, _ = used(t, model)
		assert.Equal(t, 10, tokens, "the model's charge stands while its reply is held")
		close(s.release)
		require.Eventually(t, func() bool {
			u, err := model.Used(context.Background())
			return err == nil && u[0] == 0
		}, 10*time.Second, time.Millisecond, "the model's charge went back once made")
	})
	t.Run("uncounted panics", func(t *testing.T) {
		ctx := context.Background()
		up, down := memstore.New(), memstore.New()
		provider := newBudget(t, up, "provider", upstream.BudgetLimits{TokensPerMinute: 1000})
		tenant := newBudget(t, down, "tenant", upstream.BudgetLimits{TokensPerMinute: 1000})
		down.Kill()
		assert.PanicsWithValue(t, "uncounted", func() {
			_, _, _ = fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, func(int, error) { panic("uncounted") }, provider, tenant)
		})
		tokens, _ := used(t, provider)
		assert.Zero(t, tokens, "the provider's charge went back")
	})
}

// A request reserves its cost of its provider's, its model's and its
// tenant's budgets per minute, each shared by every gateway of the fleet,
// all or nothing; once it is done, it settles them with what it used.
func ExampleReserveAll() {
	store := memstore.New() // each gateway's client of the fleet's Redis or PostgreSQL
	ctx := context.Background()
	provider, _ := fleet.NewBudget(store, "provider", upstream.BudgetLimits{TokensPerMinute: 100_000}, 0)
	model, _ := fleet.NewBudget(store, "model:small", upstream.BudgetLimits{TokensPerMinute: 20_000}, 0)
	tenant, _ := fleet.NewBudget(store, "tenant:acme", upstream.BudgetLimits{TokensPerMinute: 5_000}, 0)
	names := []string{"provider", "model", "tenant"}

	for _, estimate := range []upstream.Tokens{{Input: 3_000, Output: 1_000}, {Input: 1_500, Output: 1_000}} {
		rs, i, err := fleet.ReserveAll(ctx, estimate, nil, provider, model, tenant)
		if err != nil {
			fmt.Printf("refused by the %s's budget: %v\n", names[i], err != nil)
			continue
		}
		// ... the request is sent; the upstream reports what it used.
		_ = rs.Settle(ctx, upstream.Tokens{Input: 3_000, Output: 200})
		left, _ := rs.Reserved()[2].Left()
		fmt.Println("the tenant's budget had", left[0], "tokens left after the estimate")
	}
	tenantUsed, _ := tenant.Used(ctx)
	fmt.Println("the tenant's minute counts", tenantUsed[0], "tokens")
	// Output:
	// the tenant's budget had 1000 tokens left after the estimate
	// refused by the tenant's budget: true
	// the tenant's minute counts 3200 tokens
}

// A reservation whose request waited longer than the budget's minute
// before Start: its charge has left the window, and another request took
// the whole budget meanwhile. Start charges it again only if it fits: here
// it does not, so Start refuses the request over budget, again if asked
// again (and it charges nothing, nor does its Cancel); once the other's second has left the
// minute, a late Start that fits is charged again in its own second, and
// settled there. The requests record is counted alike.
func TestStartAfterTheMinuteChargesAgainIfItFits(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	s := memstore.NewWithClock(now)
	b := newBudget(t, s, "b", upstream.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 2})

	late, err := b.Reserve(ctx, upstream.Tokens{Input: 60}) // admitted, then queued for the provider
	require.NoError(t, err)
	advance(61 * time.Second)
	other, err := b.Reserve(ctx, upstream.Tokens{Input: 100}) // late's charge has left: the window is empty
	require.NoError(t, err)
	require.NoError(t, other.Start(ctx))
	err = late.Start(ctx)
	require.ErrorIs(t, err, upstream.ErrOverBudget, "60 more over the 100 started in this minute")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Positive(t, le.RetryAfter)
	assert.ErrorIs(t, late.Start(ctx), upstream.ErrOverBudget, "asked again, still refused: its request must not go")
	require.NoError(t, late.Cancel(ctx))
	tokens, requests := used(t, b)
	assert.Equal(t, []int{100, 1}, []int{tokens, requests}, "the other's alone")

	again, err := b.Reserve(ctx, upstream.Tokens{Input: 30}) // the budget is spent for this minute
	if err == nil {
		require.NoError(t, again.Cancel(ctx))
	}
	require.ErrorIs(t, err, upstream.ErrOverBudget)

	// A late Start that fits: charged again in its own second.
	advance(61 * time.Second) // the other's second has left the minute
	later, err := b.Reserve(ctx, upstream.Tokens{Input: 40})
	require.NoError(t, err)
	advance(61 * time.Second)
	require.NoError(t, later.Start(ctx), "40 fits the empty minute")
	tokens, requests = used(t, b)
	assert.Equal(t, []int{40, 1}, []int{tokens, requests}, "charged again in the second it starts")
	require.NoError(t, later.Settle(ctx, upstream.Tokens{Input: 25}))
	tokens, _ = used(t, b)
	assert.Equal(t, 25, tokens, "settled in that second")
}

// failingBudgets is a store whose Budget calls fail while fail is set.
type failingBudgets struct {
	driver.Store
	mu     sync.Mutex
	calls  int
	failAt int // the call number that fails (1-based); 0: none
}

func (s *failingBudgets) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	s.mu.Lock()
	s.calls++
	fail := s.calls == s.failAt
	s.mu.Unlock()
	if fail {
		return driver.BudgetResult{}, errors.New("the store went away")
	}
	return s.Store.Budget(ctx, c)
}

// A Start past the minute whose charge again fails for the store's error:
// Start returns that error, and what the request used is charged as a debt
// when it settles (it went ahead); cancelled, it charges nothing.
func TestStartAfterTheMinuteStoreErrorChargesTheUseAsDebt(t *testing.T) {
	for _, settle := range []bool{true, false} {
		ctx := context.Background()
		now, advance := stepClock()
		s := &failingBudgets{Store: memstore.NewWithClock(now)}
		b := newBudget(t, s, "b", upstream.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 10})
		late, err := b.Reserve(ctx, upstream.Tokens{Input: 60})
		require.NoError(t, err)
		advance(61 * time.Second)
		s.mu.Lock()
		s.failAt = s.calls + 3 // the tokens' move, its taking back, then their charge again
		s.mu.Unlock()
		err = late.Start(ctx)
		require.Error(t, err)
		require.NotErrorIs(t, err, upstream.ErrOverBudget)
		if settle {
			require.NoError(t, late.Settle(ctx, upstream.Tokens{Input: 80}))
		} else {
			require.NoError(t, late.Cancel(ctx))
		}
		tokens, requests := used(t, b)
		if settle {
			assert.Equal(t, []int{80, 1}, []int{tokens, requests}, "its use charged as a debt")
		} else {
			assert.Equal(t, []int{0, 0}, []int{tokens, requests}, "cancelled: nothing")
		}
	}
}

// stepClock is a clock for a store that moves only when advance is
// called.
func stepClock() (now func() time.Time, advance func(time.Duration)) {
	var mu sync.Mutex
	at := time.Unix(1_800_000_000, 0)
	return func() time.Time { mu.Lock(); defer mu.Unlock(); return at },
		func(d time.Duration) { mu.Lock(); at = at.Add(d); mu.Unlock() }
}

// A request refused by one Budget is told to come back when every Budget
// of the call takes it: the Budgets after the one that refused are asked
// when they would (a check, which charges nothing), and the refusal of
// the one that takes it last is returned, with its index. (Told the first
// refusal's time alone, the request came back when the provider's budget
// took it, and the model's refused it again.) Here the provider's tokens
// are spent until second 61, and the model's requests until 71: asked in
// second 20, the request is told 51 s, the model's requests binding.
// Taken, it costs no call more than before; refused, one per record of
// each Budget after the one that refused.
func TestReserveAllRefusalWaitsForTheLaterBudgets(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	s := &countingBudgets{Store: memstore.NewWithClock(now)}
	provider := newBudget(t, s, "provider", upstream.BudgetLimits{TokensPerMinute: 100})
	model := newBudget(t, s, "model", upstream.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 1})
	tenant := newBudget(t, s, "tenant", upstream.BudgetLimits{TokensPerMinute: 1000})

	_, _, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 100}, nil, provider)
	require.NoError(t, err)
	advance(10 * time.Second)
	_, _, err = fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, model)
	require.NoError(t, err)
	advance(10 * time.Second)

	s.calls.Store(0)
	_, i, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, provider, nil, model, tenant)
	require.ErrorIs(t, err, upstream.ErrOverBudget)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 51*time.Second, le.RetryAfter, "when the model's budget takes it, not the provider's 41 s")
	assert.Equal(t, []any{"model", upstream.CapMaxRequestsPerMinute, 1, 1}, []any{le.Key, le.Cap, le.InFlight, le.Limit}, "the budget that binds")
	assert.Equal(t, 2, i, "its index")
	assert.Equal(t, int32(1+2+1), s.calls.Load(), "the provider's charge refused, then a check per record of the model's and the tenant's")
	tokens, _ := used(t, provider)
	assert.Equal(t, 100, tokens)
	tokens, requests := used(t, model)
	assert.Equal(t, []int{10, 1}, []int{tokens, requests}, "the checks charged nothing")
	tokens, _ = used(t, tenant)
	assert.Zero(t, tokens)

	advance(le.RetryAfter)
	s.calls.Store(0)
	rs, i, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, provider, nil, model, tenant)
	require.NoError(t, err, "back when told: taken")
	assert.Equal(t, -1, i)
	assert.Len(t, rs.Reserved(), 3)
	assert.Equal(t, int32(1+2+1), s.calls.Load(), "a charge per record, and no check")
}

// countingBudgets counts the calls made on its budgets.
type countingBudgets struct {
	driver.Store
	calls atomic.Int32
}

func (s *countingBudgets) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	s.calls.Add(1)
	return s.Store.Budget(ctx, c)
}

// Start, for a request that waited past the minute, charges it again on
// each Budget: when several refuse, the refusal first in its error (the
// one errors.As finds) is the one that tells the latest time, so the
// request comes back when each of them takes it. Here A is spent by
// another request in second 61, until 122, and B in second 71, until
// 132: started in second 80, the request is told B's 52 s, not A's 42 s.
func TestReservationsStartRefusedByTwoBudgets(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	s := memstore.NewWithClock(now)
	a := newBudget(t, s, "a", upstream.BudgetLimits{TokensPerMinute: 100})
	b := newBudget(t, s, "b", upstream.BudgetLimits{TokensPerMinute: 100})

	late, _, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, a, b) // admitted, then queued past the minute
	require.NoError(t, err)
	advance(61 * time.Second)
	_, err = a.Reserve(ctx, upstream.Tokens{Input: 100})
	require.NoError(t, err)
	advance(10 * time.Second)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 100})
	require.NoError(t, err)
	advance(9 * time.Second)

	err = late.Start(ctx)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, []any{"b", 52 * time.Second}, []any{le.Key, le.RetryAfter}, "when B takes it, not A's 42 s")
	require.ErrorAs(t, late.Start(ctx), &le)
	assert.Equal(t, []any{"b", 52 * time.Second}, []any{le.Key, le.RetryAfter}, "asked again: the same")
	require.NoError(t, late.Cancel(ctx))
	for _, x := range []*fleet.Budget{a, b} {
		tokens, _ := used(t, x)
		assert.Equal(t, 100, tokens, "nothing of late's is charged")
	}
}

// LaterRefusal is ReserveAll's rule for Budgets reserved in steps: a
// refusal over budget is replaced by that of the Budget that would take
// the request last, with its index; a refusal that tells a later time
// than each of them, or an error that is no refusal over budget (which
// asks none), stands, with -1.
func TestLaterRefusal(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	s := &countingBudgets{Store: memstore.NewWithClock(now)}
	tenant := newBudget(t, s, "tenant", upstream.BudgetLimits{TokensPerMinute: 100})
	provider := newBudget(t, s, "provider", upstream.BudgetLimits{TokensPerMinute: 100})
	roomy := newBudget(t, s, "roomy", upstream.BudgetLimits{TokensPerMinute: 1000})
	_, _, err := fleet.ReserveAll(ctx, upstream.Tokens{Input: 100}, nil, tenant)
	require.NoError(t, err)
	advance(10 * time.Second)
	_, _, err = fleet.ReserveAll(ctx, upstream.Tokens{Input: 100}, nil, provider)
	require.NoError(t, err)
	advance(10 * time.Second)

	_, _, refused := fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, tenant)
	require.ErrorIs(t, refused, upstream.ErrOverBudget)
	i, err := fleet.LaterRefusal(ctx, upstream.Tokens{Input: 10}, refused, roomy, nil, provider)
	assert.Equal(t, 2, i, "the provider's, which takes it in second 71")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, []any{"provider", 51 * time.Second}, []any{le.Key, le.RetryAfter})

	_, _, refused = fleet.ReserveAll(ctx, upstream.Tokens{Input: 10}, nil, provider)
	i, err = fleet.LaterRefusal(ctx, upstream.Tokens{Input: 10}, refused, tenant, roomy)
	assert.Equal(t, -1, i, "the tenant's takes it sooner, in second 61")
	assert.Same(t, refused, err)

	s.calls.Store(0)
	for _, other := range []error{nil, context.Canceled, fleet.ErrUnavailable} {
		i, err = fleet.LaterRefusal(ctx, upstream.Tokens{Input: 10}, other, provider)
		assert.Equal(t, -1, i)
		assert.Equal(t, other, err)
	}
	assert.Zero(t, s.calls.Load(), "no refusal over budget: nothing asked")
}
