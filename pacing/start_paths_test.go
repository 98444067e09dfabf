package pacing_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A reservation starts once: a second Start more than a minute after the
// first (a long stream, a caller that starts again) checked the budget
// again, refused the request already in flight and took the reservation
// for refused, so that its Settle charged nothing of what it used.
func TestBudgetStartedReservationStartsOnce(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000})
		require.NoError(t, err)
		r, err := b.Reserve(pacing.Tokens{Input: 600})
		require.NoError(t, err)
		time.Sleep(10 * time.Second)
		require.NoError(t, r.Start()) // sent at 10 s
		time.Sleep(61 * time.Second)  // still streaming; its start left the minute
		other, err := b.Reserve(pacing.Tokens{Input: 600})
		require.NoError(t, err)
		require.NoError(t, other.Start())
		assert.NoError(t, r.Start(), "started already: does nothing")
		r.Settle(pacing.Tokens{Input: 900}) // 300 over its estimate: debt now
		assert.Equal(t, 1000-600-300, b.Status()[0].Left, "the underestimate is charged as debt")
	})
}

// A second Start within the minute does not move a started request's
// charge again, later than the second it started in: it would count past
// the minute after its start.
func TestBudgetSecondStartDoesNotMove(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000})
		require.NoError(t, err)
		r, err := b.Reserve(pacing.Tokens{Input: 600})
		require.NoError(t, err)
		time.Sleep(10 * time.Second)
		require.NoError(t, r.Start()) // sent at 10 s
		time.Sleep(40 * time.Second)
		require.NoError(t, r.Start()) // a second call, at 50 s
		time.Sleep(22 * time.Second)  // 72 s: its start (10 s) has left the minute
		assert.Equal(t, 1000, b.Status()[0].Left, "started at 10 s: counted until 71 s")
		r.Settle(pacing.Tokens{Input: 600})
	})
}

// On a clock that goes back (a mock's), Start leaves the charge where it
// is: moved to an earlier step than the one the window charges in, it was
// charged in the window's current step but recorded as in the earlier
// one, so that its Cancel took it from a step that held nothing.
func TestBudgetStartOnAClockThatWentBack(t *testing.T) {
	clk := clock.NewMock()
	base := clk.Now()
	b, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000}, slots.WithClock(clk))
	require.NoError(t, err)
	clk.Set(base.Add(10 * time.Second))
	r, err := b.Reserve(pacing.Tokens{Input: 600})
	require.NoError(t, err)
	clk.Set(base.Add(5 * time.Second)) // back
	require.NoError(t, r.Start())
	r.Cancel()
	assert.Equal(t, 1000, b.Status()[0].Left)
	clk.Set(base.Add(67 * time.Second)) // step 5 has left the minute, step 10 not
	assert.Equal(t, 1000, b.Status()[0].Left, "a cancelled request counts nothing")
}

// A panic in a Trace's Admitted sends nothing, and the Traces told
// Admitted before it hear Settled, not Served: one that keeps a Budget
// (Start in Admitted, Cancel when not Served) cancels it. They heard
// nothing: the request, never sent, stayed charged, and its reservation
// open.
func TestAdmittedPanicSettlesTheTracesTold(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	rt := pacing.NewTransport(base, gate)
	tenant, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000})
	require.NoError(t, err)
	r, err := tenant.Reserve(pacing.Tokens{Input: 600})
	require.NoError(t, err)
	var settled []pacing.Settlement
	ctx := pacing.WithTokens(t.Context(), pacing.Tokens{Input: 600})
	ctx = pacing.WithTrace(ctx, &pacing.Trace{
		Admitted: func(pacing.Admission) { _ = r.Start() },
		Settled: func(st pacing.Settlement) {
			settled = append(settled, st)
			if st.Served {
				r.Settle(st.Used)
			} else {
				r.Cancel()
			}
		},
	})
	ctx = pacing.WithTrace(ctx, &pacing.Trace{Admitted: func(pacing.Admission) { panic("metrics") }})
	assert.PanicsWithValue(t, "metrics", func() { _, _ = rt.RoundTrip(post(t, ctx, `{"model":"m"}`)) })
	assert.Zero(t, sent())
	assert.Equal(t, []pacing.Settlement{{}}, settled, "told Admitted, then Settled not served")
	assert.Equal(t, 1000, tenant.Status()[0].Left, "the request never sent charges the tenant nothing")
}

// A credential function that panics sends nothing either: the Gate's
// grant is given back, as its FleetReservation is cancelled (its estimate
// stood in the Gate's budgets, and its start in the spacing).
func TestCredentialPanicChargesTheGateNothing(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	rt := pacing.NewTransport(base, gate, pacing.WithCredential(func(http.Header, string) { panic("vault") }))
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), `{"model":"m"}`))
	}()
	assert.Zero(t, sent())
	st := gate.Status()
	assert.Zero(t, st.InFlight)
	require.NotEmpty(t, st.Budgets)
	assert.Equal(t, 1000, st.Budgets[0].Left, "the Gate's budget charged nothing")
	assert.True(t, st.LastStart.IsZero(), "nor its spacing")
}
