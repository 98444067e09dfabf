package pacing_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A credential function that panics sends nothing: the Traces told
// Admitted hear it Settled, not Served, as they do when a Trace's Admitted
// panics, so that a budget kept with a Trace (Trace.Settled's recipe:
// Start in Admitted, Cancel when not Served) charges nothing for it. They
// heard nothing: the tenant's estimate stood for a request never sent.
func TestCredentialPanicTellsTheTraceNotSent(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	tenant, err := pacing.NewBudget(pacing.BudgetLimits{TokensPerMinute: 1000})
	require.NoError(t, err)
	r, err := tenant.Reserve(pacing.Tokens{Input: 100})
	require.NoError(t, err)
	var mu sync.Mutex
	var settled []pacing.Settlement
	ctx := pacing.WithTrace(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), &pacing.Trace{
		Admitted: func(pacing.Admission) { _ = r.Start() },
		Settled: func(st pacing.Settlement) {
			mu.Lock()
			settled = append(settled, st)
			mu.Unlock()
			if !st.Served {
				r.Cancel()
			} else {
				r.Settle(st.Used)
			}
		},
	})
	rt := pacing.NewTransport(base, gate, pacing.WithCredential(func(http.Header, string) { panic("vault") }))
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	}()
	r.Close() // the request is over: an estimate not settled stands
	assert.Zero(t, sent())
	assert.Zero(t, gate.Status().InFlight)
	mu.Lock()
	assert.Equal(t, []pacing.Settlement{{}}, settled, "told Admitted, then Settled not served")
	mu.Unlock()
	assert.Equal(t, 1000, tenant.Status()[0].Left, "the request never sent charges the tenant nothing")
}
