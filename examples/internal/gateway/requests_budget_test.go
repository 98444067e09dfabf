package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingUpstream answers every request 200 with a small completion,
// or with the status in its X-Answer header, and counts what it was sent.
func countingUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var sent atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if s, _ := strconv.Atoi(r.Header.Get("X-Answer")); s != 0 {
			w.WriteHeader(s)
			io.WriteString(w, `{"error":{"message":"no","type":"invalid_request_error"}}`)
			return
		}
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`)
	}))
	t.Cleanup(up.Close)
	return up, &sent
}

// Budgets of requests per minute, without a tokenizer: the provider's
// (max_requests_per_minute) and an org's count every request once, in a
// burst, a client error (400) too, since it was sent; one over either is
// answered 429 at once, naming it, with a Retry-After from its refill; the
// answers carry x-ratelimit-*-requests, and /metrics the budget.
func TestGatewayRequestsBudget(t *testing.T) {
	up, sent := countingUpstream(t)
	srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s",
		"provider": {"max_requests_per_minute": 5, "max_queue_wait_ms": 100},
		"orgs": {"default_limit": 10, "budgets": {"org-a": {"max_requests_per_minute": 2}}}}`)
	body := `{"model":"m","messages":[{"content":"hello"}]}`

	resp, _ := sendOrg(t, srv.URL, "org-a", body, map[string]string{"X-Answer": "400"})
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, _ = sendOrg(t, srv.URL, "org-a", body, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "5", resp.Header.Get("X-Ratelimit-Limit-Requests"))
	assert.Equal(t, "3", resp.Header.Get("X-Ratelimit-Remaining-Requests"), "the 400 and this one")
	assert.NotEmpty(t, resp.Header.Get("X-Ratelimit-Reset-Requests"))
	assert.Empty(t, resp.Header.Get("X-Ratelimit-Limit-Tokens"), "no token budget")
	resp, text := sendOrg(t, srv.URL, "org-a", body, nil)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "tenant_max_requests_per_minute", resp.Header.Get(CapHeader))
	assert.Contains(t, text, "over the tenant_max_requests_per_minute budget: 2 of 2 requests started in the last minute")
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err)
	assert.InDelta(t, 60, retry, 2)

	for i := range 3 {
		resp, _ = sendOrg(t, srv.URL, "org-b", body, nil)
		require.Equal(t, http.StatusOK, resp.StatusCode, "org-b's request %d", i)
		assert.Equal(t, strconv.Itoa(2-i), resp.Header.Get("X-Ratelimit-Remaining-Requests"))
	}
	resp, text = sendOrg(t, srv.URL, "org-b", body, nil)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "max_requests_per_minute", resp.Header.Get(CapHeader), "the provider's budget: 2 of org-a's and 3 of org-b's")
	assert.Contains(t, text, "5 of 5 requests")
	assert.Equal(t, int64(2+3), sent.Load(), "the upstream saw the 400 and the four served, no refused one")

	metrics := scrape(t, &http.Client{}, srv.URL)
	assert.Contains(t, metrics, `inflight_budget_requests_limit{cap="provider"} 5`)
	assert.Contains(t, metrics, `inflight_budget_requests_left{cap="provider"} 0`)
}

// A request the upstream refused (overloaded, 503) is no request: neither
// the provider's budget of requests nor its org's counts it.
func TestGatewayRequestsBudgetRefusedUpstream(t *testing.T) {
	up, sent := countingUpstream(t)
	srv, g := startGatewayWith(t, up.URL, `{"upstream": "%s", "provider": {"max_requests_per_minute": 5},
		"orgs": {"default_limit": 10, "budgets": {"org-a": {"max_requests_per_minute": 1}}}}`)
	resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, map[string]string{"X-Answer": "503"})
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, int64(1), sent.Load())
	for _, b := range g.gate.Budgets() {
		assert.Equal(t, b.Limit, b.Left, "the provider's %s", b.Cap)
	}
	st := g.orgBudgets.Status("org-a")
	require.Len(t, st, 1)
	assert.Equal(t, 1, st[0].Left, "the org's")
}

// zeroUsageUpstream serves every request, reporting that it used nothing.
func zeroUsageUpstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":""}}],"usage":{"prompt_tokens":0,"completion_tokens":0}}`)
	}))
	t.Cleanup(up.Close)
	return up
}

// A served request that reports it used no tokens is still a request: its
// org's budget (and, with a fleet, the provider's) keeps it counted.
func TestGatewayRequestsBudgetZeroUsage(t *testing.T) {
	countOK := func(url string, n int) (ok int) {
		for range n {
			if r, _ := sendOrg(t, url, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, nil); r.StatusCode == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	srv, _ := startGatewayWith(t, zeroUsageUpstream(t).URL, `{"upstream": "%s", "provider": {"max_requests_per_minute": 100},
		"orgs": {"default_limit": 10, "budgets": {"org-a": {"max_requests_per_minute": 1}}}, "tokens": {"expected_output": 100}}`)
	assert.Equal(t, 1, countOK(srv.URL, 5), "the org's budget")
	srv, _ = startGatewayWith(t, zeroUsageUpstream(t).URL, `{"upstream": "%s", "provider": {"max_requests_per_minute": 2},
		"orgs": {"default_limit": 10}, "tokens": {"expected_output": 100},
		"fleet": {`+fleetStores["redis"](t)+`, "on_unavailable": "closed"}}`)
	assert.Equal(t, 2, countOK(srv.URL, 6), "the fleet's provider budget")
}

// Three gateways on one store (Redis, PostgreSQL) share the provider's
// budget of requests per minute and an org's: an org's requests through
// any gateway are held to its budget, and of a burst over the three no
// more than what the provider's has left reaches the upstream.
func TestGatewayFleetRequestsBudget(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) { testGatewayFleetRequestsBudget(t, store(t)) })
	}
}

func testGatewayFleetRequestsBudget(t *testing.T, store string) {
	const perMinute, orgPerMinute, burst = 30, 4, 60
	up, sent := countingUpstream(t)
	format := `{"upstream": "%s",
		"provider": {"max_requests_per_minute": ` + strconv.Itoa(perMinute) + `, "max_queue": 200},
		"orgs": {"default_limit": 1000, "budgets": {"org-a": {"max_requests_per_minute": ` + strconv.Itoa(orgPerMinute) + `}}},
		"fleet": {` + store + `, "on_unavailable": "closed"}}`
	var urls []string
	for range 3 {
		srv, _ := startGatewayWith(t, up.URL, format)
		urls = append(urls, srv.URL)
	}
	body := `{"model":"m","messages":[{"content":"hello"}]}`
	served := 0
	for i := range orgPerMinute + 2 {
		resp, _ := sendOrg(t, urls[i%3], "org-a", body, nil)
		switch resp.StatusCode {
		case http.StatusOK:
			served++
			assert.Equal(t, strconv.Itoa(orgPerMinute), resp.Header.Get("X-Ratelimit-Limit-Requests"), "the tightest: the org's")
			assert.Equal(t, strconv.Itoa(orgPerMinute-served), resp.Header.Get("X-Ratelimit-Remaining-Requests"))
		case http.StatusTooManyRequests:
			assert.Equal(t, "tenant_max_requests_per_minute", resp.Header.Get(CapHeader))
		default:
			t.Errorf("status %d", resp.StatusCode)
		}
	}
	assert.Equal(t, orgPerMinute, served, "org-a's budget, across the three gateways")

	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for i := range burst {
		wg.Go(func() {
			resp, _ := sendOrg(t, urls[i%3], "org-b", body, nil)
			mu.Lock()
			counts[resp.StatusCode]++
			mu.Unlock()
			if resp.StatusCode == http.StatusTooManyRequests {
				assert.Equal(t, "max_requests_per_minute", resp.Header.Get(CapHeader))
			}
		})
	}
	wg.Wait()
	t.Logf("a burst of %d: %v (status: count); the upstream saw %d in all", burst, counts, sent.Load())
	assert.Equal(t, burst, counts[http.StatusOK]+counts[http.StatusTooManyRequests]+counts[http.StatusServiceUnavailable],
		"served, refused, or the store unavailable; nothing else")
	assert.LessOrEqual(t, counts[http.StatusOK], perMinute-orgPerMinute, "never over the provider's budget")
	// A call that timed out may have been charged: it is answered 503, and
	// counts on the budget all the same.
	assert.GreaterOrEqual(t, counts[http.StatusOK]+counts[http.StatusServiceUnavailable], perMinute-orgPerMinute,
		"refused only once the budget was spent")
	assert.Equal(t, int64(orgPerMinute+counts[http.StatusOK]), sent.Load(), "the upstream saw the served alone")
	for _, url := range urls {
		assert.Contains(t, scrape(t, &http.Client{}, url), fmt.Sprintf(`inflight_budget_requests_limit{cap="provider"} %d`, perMinute))
	}
}

// With a fleet, an answer's rate-limit headers tell the tightest of the
// fleet's budgets and the Gate's own (its API keys', which stay per
// gateway).
func TestGatewayFleetRateLimitHeadersWithKeyBudgets(t *testing.T) {
	up, _ := countingUpstream(t)
	srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s",
		"provider": {"max_requests_per_minute": 100, "api_keys": [{"id": "k1", "max_requests_per_minute": 3}]},
		"orgs": {"default_limit": 10},
		"fleet": {`+fleetStores["redis"](t)+`}}`)
	resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "3", resp.Header.Get("X-Ratelimit-Limit-Requests"), "the key's budget, tighter than the fleet's provider budget")
	assert.Equal(t, "2", resp.Header.Get("X-Ratelimit-Remaining-Requests"))
}
