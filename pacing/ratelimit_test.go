package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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

// An upstream's 429 whose own headers say its requests allowance ran out
// (x-ratelimit-remaining-requests 0, reset in 7 s) is a rate refusal with
// WithRateLimitHeaders as without, and its client gets the upstream's
// headers on it, not the Gate's; an error answer without headers of its
// own, and a 2xx whatever it carries, get the Gate's. Before, the Gate's
// were written over the upstream's before the body, and so the verdict,
// was read: the refusal was Concurrency with no wait (a learned cap cut,
// starts not paused), and its client was told 99 requests were left.
func TestTransportRateLimitHeadersOnTheUpstreamsAnswers(t *testing.T) {
	upstreams := http.Header{"X-Ratelimit-Limit-Requests": {"60"}, "X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"7s"}}
	const refusal = `{"error":{"message":"too many requests"}}`
	for _, tc := range []struct {
		name      string
		status    int
		header    http.Header
		want      pacing.Verdict
		remaining string // what the client is told of the requests left
	}{
		{"a 429 of the upstream's keeps its headers", 429, upstreams, pacing.Verdict{Kind: pacing.Rate, RetryAfter: 7 * time.Second}, "0"},
		{"a 429 without headers gets the Gate's", 429, http.Header{}, pacing.Verdict{Kind: pacing.Concurrency}, "99"},
		{"a 200 gets the Gate's in place of the upstream's", 200, upstreams, pacing.Verdict{Kind: pacing.Admitted}, "99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, pacing.DefaultClassifier(tc.status, tc.header, []byte(refusal)), "the answer alone")
			for _, headers := range []bool{false, true} {
				gate := tGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 100}})
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					h := tc.header.Clone()
					h.Set("Content-Type", "application/json")
					return &http.Response{StatusCode: tc.status, Header: h, Body: io.NopCloser(strings.NewReader(refusal)), Request: r}, nil
				})
				var got []pacing.Verdict
				classify := func(status int, h http.Header, body []byte) pacing.Verdict {
					v := pacing.DefaultClassifier(status, h, body)
					got = append(got, v)
					return v
				}
				opts := []pacing.TransportOption{pacing.WithClassifier(classify)}
				if headers {
					opts = append(opts, pacing.WithRateLimitHeaders())
				}
				resp, err := pacing.NewTransport(base, gate, opts...).RoundTrip(post(t, t.Context(), `{"model":"m"}`))
				require.NoError(t, err)
				done(t, resp)
				assert.Equal(t, []pacing.Verdict{tc.want}, got, "WithRateLimitHeaders %v: the verdict", headers)
				if headers {
					assert.Equal(t, tc.remaining, resp.Header.Get("X-Ratelimit-Remaining-Requests"))
				}
			}
		})
	}
}

// The Gate's own rate-limit headers, set on an upstream's 429 that had
// none, are not taken for the upstream's: with one request a minute, the
// Gate's say none is left (remaining 0, reset in a minute), but the 429
// itself said nothing of a rate, and is Concurrency. Before, its body was
// classified, as it was read, from the answer's headers as they were by
// then, the Gate's: Rate, pausing starts for a minute.
func TestTransportRateLimitHeadersAreNotTheUpstreams(t *testing.T) {
	gate := tGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}})
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 429, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"error":{"message":"too many requests"}}`)), Request: r}, nil
	})
	var got []pacing.Verdict
	classify := func(status int, h http.Header, body []byte) pacing.Verdict {
		v := pacing.DefaultClassifier(status, h, body)
		got = append(got, v)
		return v
	}
	resp, err := pacing.NewTransport(base, gate, pacing.WithClassifier(classify), pacing.WithRateLimitHeaders()).RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	require.Equal(t, "0", resp.Header.Get("X-Ratelimit-Remaining-Requests"), "the Gate's, set before the body is read")
	done(t, resp)
	assert.Equal(t, []pacing.Verdict{{Kind: pacing.Concurrency}}, got)
	assert.Equal(t, uint64(1), gate.Learned().ByKind[pacing.Concurrency], "answers by kind: %v", gate.Learned().ByKind)
}

// On a 2xx, the Gate's numbers take the place of every x-ratelimit-*
// header of the upstream's, also of the kinds the Gate has no budget of
// (before, a Gate that counts tokens alone left the upstream's requests
// allowance, one key's, beside its own tokens), and of a reset its budget
// has none of yet; a Gate with no budget to tell leaves the upstream's as
// they came.
func TestTransportRateLimitHeadersReplaceEveryKind(t *testing.T) {
	upstreams := http.Header{
		"X-Ratelimit-Limit-Requests": {"10000"}, "X-Ratelimit-Remaining-Requests": {"9999"}, "X-Ratelimit-Reset-Requests": {"6ms"},
		"X-Ratelimit-Limit-Tokens": {"2000000"}, "X-Ratelimit-Reset-Tokens": {"1ms"},
	}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: upstreams.Clone(), Body: io.NopCloser(strings.NewReader(`{}`)), Request: r}, nil
	})
	send := func(cfg pacing.Config) http.Header {
		gate := tGate(t, cfg)
		resp, err := pacing.NewTransport(base, gate, pacing.WithRateLimitHeaders()).RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 10}), `{"model":"m"}`))
		require.NoError(t, err)
		done(t, resp)
		return resp.Header
	}
	h := send(pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	assert.Equal(t, "1000", h.Get("X-Ratelimit-Limit-Tokens"))
	assert.Equal(t, "990", h.Get("X-Ratelimit-Remaining-Tokens"))
	assert.NotEqual(t, "1ms", h.Get("X-Ratelimit-Reset-Tokens"), "not the upstream's reset")
	for name := range h {
		assert.False(t, strings.HasSuffix(name, "-Requests"), "the upstream's %s: %s", name, h.Get(name))
	}
	h = send(pacing.Config{MaxConcurrentRequests: 4})
	for name, v := range upstreams {
		assert.Equal(t, v, h[name], "no budget: the upstream's %s, as it came", name)
	}
	assert.Empty(t, h.Get("X-Ratelimit-Remaining-Tokens"))
}
