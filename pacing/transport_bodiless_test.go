package pacing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
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

// A base whose answers do not name their request (net/http's do) is read
// the same: a HEAD's 429 with a Body that is not http.NoBody is classified
// before its slot goes, and charges nothing.
func TestTransportBodilessAnswerWithoutItsRequest(t *testing.T) {
	base := roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"5"}}, Body: io.NopCloser(strings.NewReader(""))}, nil
	})
	g := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	var settled []pacing.Settlement
	ctx := pacing.WithTrace(pacing.WithTokens(pacing.WithModelName(context.Background(), "m"), pacing.Tokens{Input: 1}),
		&pacing.Trace{Settled: func(st pacing.Settlement) { settled = append(settled, st) }})
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, "http://upstream.invalid/", nil)
	require.NoError(t, err)
	resp, err := pacing.NewTransport(base, g).RoundTrip(req)
	require.NoError(t, err)
	assert.Zero(t, g.Status().InFlight)
	assert.Equal(t, []pacing.Settlement{{}}, settled, "refused, before its body is closed")
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, []pacing.Settlement{{}}, settled)
}
