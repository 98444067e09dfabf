package pacing_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/pacing"
)

// SetRateLimitHeaders removes a reset the budget has none of from h in any
// spelling of its name: a header map built by hand (a base RoundTripper's
// literal) kept one that the numbers beside it contradicted.
func TestSetRateLimitHeadersAnySpelling(t *testing.T) {
	h := http.Header{"x-ratelimit-reset-tokens": {"6m0s"}}
	pacing.SetRateLimitHeaders(h, []pacing.BudgetStatus{{Cap: pacing.CapTokensPerMinute, Limit: 1000, Left: 1000}}, "m", "")
	assert.Equal(t, "1000", h.Get("X-Ratelimit-Remaining-Tokens"))
	for name := range h {
		assert.NotEqual(t, "x-ratelimit-reset-tokens", name, "a reset left beside a full budget: %v", h)
	}

	// SetAnswerRateLimitHeaders, on a 2xx, removes every spelling.
	resp := &http.Response{StatusCode: 200, Header: http.Header{"x-ratelimit-reset-tokens": {"6m0s"}}}
	pacing.SetAnswerRateLimitHeaders(resp, []pacing.BudgetStatus{{Cap: pacing.CapTokensPerMinute, Limit: 1000, Left: 1000}}, "m", "")
	//lint:ignore SA1008 the spelling of a map built by hand is what is tested
	assert.Empty(t, resp.Header["x-ratelimit-reset-tokens"])
}
