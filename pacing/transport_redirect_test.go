package pacing_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A redirect (a 3xx with a Location) uses no tokens: its estimate comes
// back, and its request stands charged (it was sent), as a client
// error's. An http.Client that follows it sends the next request through
// the Transport, which charges that one its own estimate. Before, a
// redirect kept its estimate: a followed one was charged twice (found by
// a bug hunt).
func TestTransportRedirectChargesNoTokens(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusTemporaryRedirect)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"usage":{"prompt_tokens":300,"completion_tokens":200}}`)
	}))
	defer srv.Close()
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2,
		BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 10000, MaxRequestsPerMinute: 10}})
	var settled []pacing.Settlement
	ctx := pacing.WithTrace(pacing.WithTokens(pacing.WithModelName(t.Context(), "m"), pacing.Tokens{Input: 1000, Output: 1000}),
		&pacing.Trace{Settled: func(st pacing.Settlement) { settled = append(settled, st) }})
	client := &http.Client{Transport: pacing.NewTransport(http.DefaultTransport, gate)}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/old", strings.NewReader(`{"model":"m"}`))
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, int32(2), hits.Load())
	assert.Equal(t, map[string]int{"tokens_per_minute//": 10000 - 500, "max_requests_per_minute//": 8}, budgetsLeft(gate),
		"the redirect's request and the followed one's usage")
	assert.Equal(t, []pacing.Settlement{{Served: true}, {Served: true, Used: pacing.Tokens{Input: 300, Output: 200}}}, settled)
	assert.Zero(t, gate.Status().InFlight)
}
