package gateway

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// An upstream that cannot be reached (every dial refused) saw none of the
// requests: each is answered 502, and none counts on the org's or the
// provider's budget of requests (a request never sent charges nothing).
// Before, each dial error spent a request of both: the org's third was
// refused 429 over its budget of 2 a minute.
func TestGatewayUnreachableUpstreamSpendsNoBudget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens: every dial is refused
	srv, g := startGatewayWith(t, url, `{"upstream": "%s",
		"provider": {"max_requests_per_minute": 5, "max_queue_wait_ms": 100},
		"orgs": {"default_limit": 10, "budgets": {"org-a": {"max_requests_per_minute": 2}}}}`)
	body := `{"model":"m","messages":[{"content":"hello"}]}`
	for i := range 3 {
		resp, text := sendOrg(t, srv.URL, "org-a", body, nil)
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "attempt %d: %s %s", i, resp.Header.Get(CapHeader), text)
	}
	for _, b := range g.gate.Budgets() {
		assert.Equal(t, b.Limit, b.Left, "the provider's budget: %+v", b)
	}
}

// The upstream refuses with a 429 whose own headers say its requests
// allowance ran out: a rate refusal, which pauses starts and says nothing
// of a concurrency cap, and its client gets those headers as they came.
// Before, with a budget of requests the gateway wrote its own
// x-ratelimit-* (99 left) over them before the answer was classified:
// it was learned as a concurrency refusal, cutting the learned cap, and
// its client was told 99 requests were left.
func TestGatewayUpstreamRateRefusal(t *testing.T) {
	srv, g := startGatewayWith(t, rateRefusing(t), `{"upstream": "%s",
		"provider": {"max_requests_per_minute": 100, "adaptive": {"max": 8}}}`)
	resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, nil)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	l := g.Learned()
	assert.Equal(t, uint64(1), l.ByKind[pacing.Rate], "answers by kind: %v", l.ByKind)
	assert.Zero(t, l.ByKind[pacing.Concurrency], "answers by kind: %v", l.ByKind)
	assert.Equal(t, "0", resp.Header.Get("X-Ratelimit-Remaining-Requests"), "the upstream's own word on its 429")
	assert.Equal(t, "2s", resp.Header.Get("X-Ratelimit-Reset-Requests"))
	assert.Empty(t, resp.Header.Get("X-Ratelimit-Limit-Requests"), "none of the gateway's added")
}

// The same through a fleet of gateways, whose budgets are the store's:
// the upstream's refusal keeps its own rate-limit headers there too (the
// fleet's were written over them).
func TestGatewayFleetUpstreamRateRefusal(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) {
			srv, _ := startGatewayWith(t, rateRefusing(t), `{"upstream": "%s",
				"provider": {"max_requests_per_minute": 100},
				"fleet": {`+store(t)+`, "on_unavailable": "closed"}}`)
			resp, _ := sendOrg(t, srv.URL, "org-a", `{"model":"m","messages":[{"content":"hello"}]}`, nil)
			require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "0", resp.Header.Get("X-Ratelimit-Remaining-Requests"), "the upstream's own word on its 429")
			assert.Equal(t, "2s", resp.Header.Get("X-Ratelimit-Reset-Requests"))
			assert.Empty(t, resp.Header.Get("X-Ratelimit-Limit-Requests"), "none of the fleet's added")
		})
	}
}

// rateRefusing starts an upstream that refuses every request for its
// rate, as OpenAI's API does (a 429 with the requests allowance at 0 and
// its reset), and returns its URL.
func rateRefusing(t *testing.T) string {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
		w.Header().Set("X-Ratelimit-Reset-Requests", "2s")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"too many requests"}}`)
	}))
	t.Cleanup(up.Close)
	return up.URL
}
