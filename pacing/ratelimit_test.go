package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// The headers tell the tightest of the budgets a request counts on, its
// tokens' and its requests' apart: another model's and another key's are
// not its own; what is in debt has 0 remaining; no budget, no header.
func TestSetRateLimitHeaders(t *testing.T) {
	budgets := []pacing.BudgetStatus{
		{Cap: pacing.CapTokensPerMinute, Limit: 1000, Left: 600, ResetIn: 30 * time.Second},
		{Cap: pacing.CapTokensPerMinute, Model: "m", Limit: 500, Left: 400, ResetIn: 1500 * time.Millisecond},
		{Cap: pacing.CapTokensPerMinute, Model: "other", Limit: 100, Left: 5},
		{Cap: pacing.CapInputTokensPerMinute, Key: "k2", Limit: 50, Left: -20, ResetIn: time.Minute},
		{Cap: pacing.CapMaxRequestsPerMinute, Limit: 10, Left: 7, ResetIn: 2 * time.Second},
		{Cap: pacing.CapMaxRequestsPerMinute, Key: "k2", Limit: 3, Left: 1},
	}
	h := http.Header{}
	pacing.SetRateLimitHeaders(h, budgets, "m", "k1")
	assert.Equal(t, http.Header{
		"X-Ratelimit-Limit-Tokens": {"500"}, "X-Ratelimit-Remaining-Tokens": {"400"}, "X-Ratelimit-Reset-Tokens": {"1.5s"},
		"X-Ratelimit-Limit-Requests": {"10"}, "X-Ratelimit-Remaining-Requests": {"7"}, "X-Ratelimit-Reset-Requests": {"2s"},
	}, h)
	h = http.Header{}
	pacing.SetRateLimitHeaders(h, budgets, "m", "k2")
	assert.Equal(t, "0", h.Get("X-Ratelimit-Remaining-Tokens"), "k2's input budget, in debt")
	assert.Equal(t, "1", h.Get("X-Ratelimit-Remaining-Requests"))
	assert.Empty(t, h.Get("X-Ratelimit-Reset-Requests"), "nothing counted: no reset")
	h = http.Header{}
	pacing.SetRateLimitHeaders(h, nil, "m", "")
	assert.Empty(t, h)
}

// With WithRateLimitHeaders a Transport's answers carry what the Gate's
// budgets had left once the request was counted.
func TestTransportRateLimitHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"usage":{"prompt_tokens":7,"completion_tokens":2}}`)
	}))
	t.Cleanup(up.Close)
	g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10},
		Models: map[string]pacing.ModelConfig{"m": {BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 500}}}})
	for _, withHeaders := range []bool{true, false} {
		var opts []pacing.TransportOption
		if withHeaders {
			opts = append(opts, pacing.WithRateLimitHeaders())
		}
		client := &http.Client{Transport: pacing.NewTransport(up.Client().Transport, g, opts...)}
		ctx := pacing.WithTokens(pacing.WithModelName(context.Background(), "m"), pacing.Tokens{Input: 10, Output: 100})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !withHeaders {
			assert.Empty(t, resp.Header.Get("X-Ratelimit-Limit-Tokens"))
			continue
		}
		assert.Equal(t, "500", resp.Header.Get("X-Ratelimit-Limit-Tokens"), "the model's budget is the tightest")
		assert.Equal(t, "390", resp.Header.Get("X-Ratelimit-Remaining-Tokens"), "its estimate counted, not yet settled")
		assert.NotEmpty(t, resp.Header.Get("X-Ratelimit-Reset-Tokens"))
		assert.Equal(t, "10", resp.Header.Get("X-Ratelimit-Limit-Requests"))
		assert.Equal(t, "9", resp.Header.Get("X-Ratelimit-Remaining-Requests"))
	}
}
