package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A request that the tokens budget refuses is told to come back when the
// requests budget takes it too, if that is later: told the tokens' time
// alone, it came back while the requests budget was still spent, and was
// refused again. Here a stream that ran past the minute settles its use as
// a debt in second 70, which fills the tokens budget until 131; two
// requests whose tokens nobody counts fill the requests budget in second
// 80, until 141.
func TestBudgetRefusalWaitsForTheRequestsBudget(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	b := newBudget(t, memstore.NewWithClock(now), "b", upstream.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 2})

	stream, err := b.Reserve(ctx, upstream.Tokens{Input: 1})
	require.NoError(t, err)
	advance(70 * time.Second)
	require.NoError(t, stream.Settle(ctx, upstream.Tokens{Input: 101}))
	advance(10 * time.Second)
	for range 2 {
		_, err := b.Reserve(ctx, upstream.Tokens{})
		require.NoError(t, err)
	}
	tokens, requests := used(t, b)
	require.Equal(t, []int{100, 2}, []int{tokens, requests})

	_, err = b.Reserve(ctx, upstream.Tokens{Input: 1})
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, upstream.ErrOverBudget)
	assert.Equal(t, 61*time.Second, le.RetryAfter, "when the requests budget takes it, not the tokens' 51 s")
	assert.Equal(t, upstream.CapMaxRequestsPerMinute, le.Cap, "the budget that binds then")
	assert.Equal(t, []int{2, 2}, []int{le.InFlight, le.Limit})
	tokens, requests = used(t, b)
	assert.Equal(t, []int{100, 2}, []int{tokens, requests}, "the refusal charged nothing")

	advance(le.RetryAfter)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 1})
	assert.NoError(t, err, "back when told: taken")
}

// The mirror case: the requests budget refuses once the tokens one took
// the request. The tokens budget took it now, and a window only sheds
// what it counts as time passes: the requests budget's time is the later.
func TestBudgetRefusalByTheRequestsBudget(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	b := newBudget(t, memstore.NewWithClock(now), "b", upstream.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 2})

	_, err := b.Reserve(ctx, upstream.Tokens{Input: 90})
	require.NoError(t, err)
	advance(10 * time.Second)
	_, err = b.Reserve(ctx, upstream.Tokens{})
	require.NoError(t, err)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 5})
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, upstream.CapMaxRequestsPerMinute, le.Cap)
	assert.Equal(t, 51*time.Second, le.RetryAfter, "the first request's second leaves the minute")
	tokens, requests := used(t, b)
	assert.Equal(t, []int{90, 2}, []int{tokens, requests}, "the tokens charged were taken back")
	advance(le.RetryAfter)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 5})
	assert.NoError(t, err, "back when told: taken")
}

// Start, for a request that waited past the minute, charges it again on
// each record: when both refuse, it is told to come back when both take
// it (the requests budget's time, here), not when the first refusal said.
// A stream settles its use as a debt in second 65, which fills the tokens
// budget until 126; two requests whose tokens nobody counts fill the
// requests budget in second 75, until 136.
func TestBudgetStartRefusedByBothRecords(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	b := newBudget(t, memstore.NewWithClock(now), "b", upstream.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 2})

	late, err := b.Reserve(ctx, upstream.Tokens{Input: 10}) // admitted, then queued past the minute
	require.NoError(t, err)
	stream, err := b.Reserve(ctx, upstream.Tokens{Input: 1})
	require.NoError(t, err)
	advance(65 * time.Second)
	require.NoError(t, stream.Settle(ctx, upstream.Tokens{Input: 101}))
	advance(10 * time.Second)
	for range 2 {
		_, err := b.Reserve(ctx, upstream.Tokens{})
		require.NoError(t, err)
	}

	err = late.Start(ctx)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 61*time.Second, le.RetryAfter, "when the requests budget takes it, not the tokens' 51 s")
	assert.Equal(t, upstream.CapMaxRequestsPerMinute, le.Cap)
	again := late.Start(ctx)
	require.ErrorAs(t, again, &le)
	assert.Equal(t, []any{61 * time.Second, upstream.CapMaxRequestsPerMinute}, []any{le.RetryAfter, le.Cap}, "asked again: the same")
	require.NoError(t, late.Cancel(ctx))
	tokens, requests := used(t, b)
	assert.Equal(t, []int{100, 2}, []int{tokens, requests}, "nothing of late's is charged")
}

// noChecks is a store of a release before checks (driver.BudgetCall's
// Check): it knows no such field, and makes a check a charge.
type noChecks struct{ *memstore.Store }

func (s noChecks) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	old := *c
	old.Check = false
	return s.Store.Budget(ctx, &old)
}

// A store that knows no checks charges the check that a refusal by the
// tokens budget makes of the requests budget: the client takes that
// charge back, and the requests budget counts no request that was
// refused. (It stood for the rest of the minute: two requests refused,
// two requests per minute spent.)
func TestBudgetCheckOnAStoreThatKnowsNone(t *testing.T) {
	ctx := context.Background()
	now, advance := stepClock()
	b := newBudget(t, noChecks{memstore.NewWithClock(now)}, "b", upstream.BudgetLimits{TokensPerMinute: 100, MaxRequestsPerMinute: 3})

	_, err := b.Reserve(ctx, upstream.Tokens{Input: 100})
	require.NoError(t, err)
	advance(10 * time.Second)
	for range 2 {
		_, err = b.Reserve(ctx, upstream.Tokens{Input: 1})
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, upstream.CapTokensPerMinute, le.Cap)
	}
	tokens, requests := used(t, b)
	assert.Equal(t, []int{100, 1}, []int{tokens, requests}, "the refused requests are not counted")
	_, err = b.Reserve(ctx, upstream.Tokens{})
	assert.NoError(t, err, "the requests budget has room")
}
