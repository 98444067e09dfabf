package pacing_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A 429 whose body the client closes unread is a refusal whose kind was
// lost (Other: nothing learned from it), but a refusal all the same: the
// upstream served nothing, so it charges the Gate's budgets nothing, its
// request neither, and the budgets kept outside the Gate are cancelled.
// Before, it settled as a client error: its tokens back, its request
// charged.
func TestTransport429ClosedUnreadChargesNothing(t *testing.T) {
	for _, read := range []bool{false, true} {
		base, sent := answering(http.StatusTooManyRequests, `{"error":{"message":"too many requests open"}}`)
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10}})
		s := &spend{}
		var mu sync.Mutex
		var settled []pacing.Settlement
		tr := &pacing.Trace{Settled: func(st pacing.Settlement) { mu.Lock(); settled = append(settled, st); mu.Unlock() }}
		ctx := pacing.WithTrace(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 300, Output: 100}), tr)
		rt := pacing.NewTransport(base, gate, reserving(s), pacing.WithCutLinger(0))
		resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
		require.NoError(t, err)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		if read {
			_, _ = resp.Body.Read(make([]byte, 4096))
		}
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, 1, sent())
		left := map[string]int{}
		for _, b := range gate.Budgets() {
			left[b.Cap] = b.Left
		}
		assert.Equal(t, 1000, left["tokens_per_minute"], "read %v: no tokens charged", read)
		assert.Equal(t, 10, left["max_requests_per_minute"], "read %v: nor its request", read)
		mu.Lock()
		assert.Equal(t, []pacing.Settlement{{}}, settled, "read %v: told once, not Served", read)
		mu.Unlock()
		assert.Equal(t, []string{"start", "cancel"}, s.Calls(), "read %v", read)
	}
}
