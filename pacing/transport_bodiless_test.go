package pacing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// An answer that HTTP says has no body (to HEAD; 204; 304) is complete as
// it comes, over HTTP/2 too, whose Body for it is not http.NoBody: its slot
// goes at once, and it is classified before. A HEAD refused with a 429 is
// settled at once and charges nothing; a served one reports no usage, so
// its estimate stands (as over HTTP/1: it was settled for none on Close).
func TestTransportBodilessAnswersOverHTTP2(t *testing.T) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, _ := strconv.Atoi(r.URL.Query().Get("status"))
		w.WriteHeader(status)
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	g := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 10_000}})
	rt := pacing.NewTransport(up.Client().Transport, g, pacing.WithModel(func(*http.Request) string { return "m" }))
	for _, tc := range []struct {
		method string
		status int
		want   []pacing.Settlement
	}{
		{http.MethodHead, 200, nil},
		{http.MethodHead, 429, []pacing.Settlement{{}}},
		{http.MethodGet, 204, nil},
		{http.MethodGet, 304, nil},
	} {
		var settled []pacing.Settlement
		ctx := pacing.WithTrace(pacing.WithTokens(context.Background(), pacing.Tokens{Input: 10, Output: 10}),
			&pacing.Trace{Settled: func(st pacing.Settlement) { settled = append(settled, st) }})
		req, err := http.NewRequestWithContext(ctx, tc.method, up.URL+"/?status="+strconv.Itoa(tc.status), nil)
		require.NoError(t, err)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, "HTTP/2.0", resp.Proto)
		assert.Zero(t, g.Status().InFlight, "%s %d: its slot went at once", tc.method, tc.status)
		assert.Equal(t, tc.want, settled, "%s %d: before its body is closed", tc.method, tc.status)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, tc.want, settled, "%s %d: after", tc.method, tc.status)
	}
	assert.Equal(t, 10_000-3*20, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left, "three answers kept their estimates; the 429 charged nothing")
}
