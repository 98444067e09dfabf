package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

type tenantKey struct{}

// tenantOf is the tenant a test's request is made for.
func tenantOf(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// tenantBudgets returns Budgets of 1,000 tokens a minute for each tenant,
// and a Transport on gate and base, with opts, that reserves them
// (WithBudgets).
func tenantBudgets(gate *pacing.Gate, base http.RoundTripper, opts ...pacing.TransportOption) (*pacing.Budgets[string], *pacing.Transport) {
	return tenantBudgetsOn(nil, gate, base, opts...)
}

// tenantBudgetsOn is tenantBudgets whose Budgets run on clk (nil: the
// real clock).
func tenantBudgetsOn(clk clock.Clock, gate *pacing.Gate, base http.RoundTripper, opts ...pacing.TransportOption) (*pacing.Budgets[string], *pacing.Transport) {
	var clocks []slots.ClockOption
	if clk != nil {
		clocks = append(clocks, slots.WithClock(clk))
	}
	tenants := pacing.NewBudgets(func(string) *pacing.BudgetLimits {
		return &pacing.BudgetLimits{TokensPerMinute: 1000}
	}, clocks...)
	reserve := pacing.WithBudgets(func(ctx context.Context, _ string, cost pacing.Tokens) (*pacing.Reservation, error) {
		return tenants.Reserve(tenantOf(ctx), cost)
	})
	return tenants, pacing.NewTransport(base, gate, append([]pacing.TransportOption{reserve}, opts...)...)
}

// tenantCtx is a request's context for tenant, estimated at cost.
func tenantCtx(ctx context.Context, tenant string, cost pacing.Tokens) context.Context {
	return pacing.WithTokens(context.WithValue(ctx, tenantKey{}, tenant), cost)
}

// readAll reads resp's body to its end and closes it.
func readAll(t *testing.T, resp *http.Response) {
	t.Helper()
	_, err := io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
}

// A tenant's budget kept in the process is reserved by the Transport
// before the request takes a slot, and settled with the usage its answer
// reported (the overestimate returned); a request over what is left is
// refused before anything is sent, with the budget's error.
func TestWithBudgetsReservesAndSettles(t *testing.T) {
	base, sent := answering(200, usageAnswer) // 3 + 5 tokens used
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2})
	tenants, rt := tenantBudgets(gate, base)
	resp, err := rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 300, Output: 500}), `{"model":"m"}`))
	require.NoError(t, err)
	assert.Equal(t, 1000-800, tenants.Status("a")[0].Left, "the estimate, reserved until the answer tells")
	readAll(t, resp)
	assert.Equal(t, 1000-8, tenants.Status("a")[0].Left, "settled with the usage reported")

	big := pacing.Tokens{Input: 995}
	_, err = rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", big), `{"model":"m"}`))
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, pacing.CapTokensPerMinute, le.Cap)
	assert.Positive(t, le.RetryAfter)
	assert.Equal(t, 1, sent(), "the refused request was not sent")
	assert.Zero(t, gate.Status().InFlight, "and holds nothing")

	resp, err = rt.RoundTrip(post(t, tenantCtx(t.Context(), "b", big), `{"model":"m"}`))
	require.NoError(t, err, "another tenant's budget is its own")
	readAll(t, resp)
}

// A request refused after its tenant's budget was reserved (by the
// upstream, by the Gate, by a fleet's budget) charges the tenant nothing;
// one sent whose answer reports no usage keeps its estimate, and its
// reservation is closed once the slot is free, so that Budgets may drop
// the tenant's Budget once idle (an open one would keep it for ever).
func TestWithBudgetsCancelsAndCloses(t *testing.T) {
	t.Run("refused by the upstream", func(t *testing.T) {
		base, _ := answering(429, `{"error":{"type":"rate_limit_error","message":"slow down"}}`)
		tenants, rt := tenantBudgets(tGate(t, pacing.Config{MaxConcurrentRequests: 2}), base)
		resp, err := rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 600}), `{"model":"m"}`))
		require.NoError(t, err)
		readAll(t, resp)
		st := tenants.Status("a")
		require.Len(t, st, 1)
		assert.Equal(t, 1000, st[0].Left, "a refused request charges nothing")
	})
	t.Run("refused by the Gate", func(t *testing.T) {
		base, sent := answering(200, usageAnswer)
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueuePerFlow: new(int)})
		tenants, rt := tenantBudgets(gate, base)
		first, err := rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 100}), `{"model":"m"}`))
		require.NoError(t, err)
		_, err = rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 600}), `{"model":"m"}`))
		require.ErrorIs(t, err, slots.ErrQueueFull)
		assert.Equal(t, 1000-100, tenants.Status("a")[0].Left, "the refused request's 600 taken back")
		readAll(t, first)
		assert.Equal(t, 1, sent())
	})
	t.Run("refused by a fleet's budget", func(t *testing.T) {
		base, sent := answering(200, usageAnswer)
		over := &slots.LimitError{Err: pacing.ErrOverBudget, Cap: pacing.CapTokensPerMinute, Limit: 10}
		tenants, rt := tenantBudgets(tGate(t, pacing.Config{MaxConcurrentRequests: 1}), base,
			pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
				return nil, over
			}))
		_, err := rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 600}), `{"model":"m"}`))
		require.ErrorIs(t, err, pacing.ErrOverBudget)
		assert.Equal(t, 1000, tenants.Status("a")[0].Left, "the tenant's reservation taken back")
		assert.Zero(t, sent())
	})
	t.Run("a credential function that panics", func(t *testing.T) {
		base, sent := answering(200, usageAnswer)
		tenants, rt := tenantBudgets(tGate(t, pacing.Config{MaxConcurrentRequests: 1}), base,
			pacing.WithCredential(func(http.Header, string) { panic("vault") }))
		assert.Panics(t, func() {
			_, _ = rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 600}), `{"model":"m"}`))
		})
		assert.Zero(t, sent())
		assert.Equal(t, 1000, tenants.Status("a")[0].Left, "not sent: the tenant charged nothing")
	})
	t.Run("no usage told, closed once free", func(t *testing.T) {
		clk := clock.NewMock()
		base, _ := answering(200, `{"choices":[]}`)
		tenants, rt := tenantBudgetsOn(clk, tGate(t, pacing.Config{MaxConcurrentRequests: 4}), base)
		const many = 1024 // the count at which Budgets first drops the idle ones
		for i := range many {
			resp, err := rt.RoundTrip(post(t, tenantCtx(t.Context(), fmt.Sprint("t", i), pacing.Tokens{Input: 10}), `{"model":"m"}`))
			require.NoError(t, err)
			readAll(t, resp)
		}
		assert.Equal(t, 1000-10, tenants.Status("t0")[0].Left, "no usage told: the estimate stands")
		clk.Add(2 * time.Minute) // each idle now
		_, err := tenants.Reserve("new", pacing.Tokens{Input: 1})
		require.NoError(t, err)
		assert.Equal(t, 1, tenants.Len(), "closed reservations let Budgets drop their idle keys")
	})
}

// A request that waited for its slot longer than a minute starts its
// tenant's reservation as it is sent: the charge, gone from the minute,
// is charged again if it fits, and if not the request is refused unsent
// with the budget's error, charging nothing (in virtual time).
func TestWithBudgetsStartsAsSent(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		base, sent := answering(200, usageAnswer)
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 120_000})
		tenants, rt := tenantBudgets(gate, base)
		first, err := rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 600}), `{"model":"m"}`))
		require.NoError(t, err) // holds the slot until 70 s
		time.Sleep(time.Second)
		errc := make(chan error, 1)
		go func() {
			resp, err := rt.RoundTrip(post(t, tenantCtx(t.Context(), "a", pacing.Tokens{Input: 300}), `{"model":"m"}`))
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		synctest.Wait()
		time.Sleep(61 * time.Second) // 62 s: both charges have left the minute
		other, err := tenants.Reserve("a", pacing.Tokens{Input: 900})
		require.NoError(t, err)
		require.NoError(t, other.Start())
		time.Sleep(8 * time.Second)
		readAll(t, first) // 70 s: the waiter has the slot, and starts
		err = <-errc
		var le *slots.LimitError
		require.ErrorAs(t, err, &le, "300 more than the 100 left")
		assert.ErrorIs(t, err, pacing.ErrOverBudget)
		assert.Equal(t, 1, sent(), "the waiter was not sent")
		other.Settle(pacing.Tokens{Input: 900})
		assert.Equal(t, 1000-900, tenants.Status("a")[0].Left, "the refused waiter charges nothing")
		assert.Zero(t, gate.Status().InFlight)
	})
}

// A request whose Trace's Admitted panicked is not sent: its tenant's
// reservation is cancelled, not left standing by the release of the
// slots (which closes it) that comes first.
func TestWithBudgetsAdmittedPanicChargesNothing(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	tenants, rt := tenantBudgets(gate, base)
	var heard []pacing.Settlement
	ctx := pacing.WithTrace(tenantCtx(t.Context(), "a", pacing.Tokens{Input: 600}), &pacing.Trace{
		Admitted: func(pacing.Admission) { panic("hook") },
		Settled:  func(st pacing.Settlement) { heard = append(heard, st) },
	})
	assert.Panics(t, func() { _, _ = rt.RoundTrip(post(t, ctx, `{"model":"m"}`)) })
	assert.Zero(t, sent())
	assert.Equal(t, []pacing.Settlement{{}}, heard, "the Trace hears it was not sent")
	assert.Equal(t, 1000, tenants.Status("a")[0].Left, "not sent: the tenant charged nothing")
	assert.Zero(t, gate.Status().InFlight)
}
