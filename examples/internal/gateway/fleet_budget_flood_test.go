package gateway

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	simulated "github.com/inflight-go/inflight/examples/internal/upstream"
)

// A provider's budget of 5,000 tokens a minute shared by three gateways
// in the fleet's store, on each store: 999 requests of max_tokens 1 sent
// at once, a third to each gateway (their estimates exact): the upstream
// sees no more than the budget start in the minute, and the budget is
// used to the last whole request. Then, on a fresh store, a first request
// larger than the budget passes, and the next, through another gateway,
// waits for the refill. (A request may also be refused for its wait, the
// store's calls under the flood counting in it: 62 of 999 behind
// PgBouncer in one run with a wait of 500 ms; 5 s here, see budgetFleet.)
func TestGatewayFleetTokenBudgetFlood(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) {
			const perMinute = 5000
			up, upURL := minuteUpstream(t)
			gateways := func() []string { return budgetFleet(t, upURL, store(t), perMinute, "") }
			prompt := strings.Repeat("hello world ", 20)
			run := floodAll(t, gateways(), 999, func(int) map[string]any {
				return map[string]any{"model": "glm-5", "stream": true, "turn_ms": 1000, "max_tokens": 1,
					"messages": []map[string]string{{"content": prompt}}}
			})
			worst, started := up.WorstMinute()
			assert.LessOrEqual(t, worst, int64(perMinute), "no minute over the budget at the upstream")
			assert.Equal(t, started, run.ok)
			assert.Equal(t, 999, run.ok+run.refused, "served or refused for the budget")
			require.Positive(t, run.ok)
			each := worst / int64(run.ok) // all alike
			assert.Less(t, perMinute-worst, each, "exact estimates: the budget is used to the last whole request")
			t.Logf("max_tokens 1 over three gateways: %d served, %d refused (by cap: %v); the upstream's worst minute %d of %d tokens",
				run.ok, run.refused, run.refusedBy, worst, perMinute)

			up.ResetMinute()
			urls := gateways() // a fresh store
			first := floodAll(t, urls[:1], 1, func(int) map[string]any {
				return map[string]any{"model": "glm-5", "stream": true, "turn_ms": 10, "max_tokens": 1,
					"messages": []map[string]string{{"content": strings.Repeat("hello world ", 3000)}}}
			})
			assert.Equal(t, 1, first.ok, "the first request passes: 6,005 tokens against 5,000")
			next := floodAll(t, urls[1:2], 1, func(int) map[string]any {
				return map[string]any{"model": "glm-5", "stream": true, "max_tokens": 1, "messages": []map[string]string{{"content": "hello"}}}
			})
			assert.Equal(t, 1, next.refused, "the next, through another gateway, waits for the refill")
			_, started = up.WorstMinute()
			assert.Equal(t, 1, started)
		})
	}
}

// Three gateways sharing a provider's budget of 5,000 tokens a minute in
// the fleet's store, on each store, whose estimates fall short: each
// request expects 5 tokens of answer and streams up to 21 (a 400 ms turn
// of 20 ms chunks). 300 sent at once: the tokens the upstream sees start
// in the minute are at most the budget plus the estimate errors of the
// requests started in it (the bound with several requests in flight: each
// started while the others' usage was unknown), and the budget is used.
func TestGatewayFleetTokenBudgetUnderestimates(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) {
			const perMinute, expected, turnMS = 5000, 5, 400
			const maxError = turnMS/20 + 1 - expected // the most an answer passes its estimate by
			up, upURL := minuteUpstream(t)
			urls := budgetFleet(t, upURL, store(t), perMinute, `"tokens": {"expected_output": `+strconv.Itoa(expected)+`},`)
			prompt := strings.Repeat("hello world ", 20)
			run := floodAll(t, urls, 300, func(int) map[string]any {
				return map[string]any{"model": "glm-5", "stream": true, "turn_ms": turnMS,
					"messages": []map[string]string{{"content": prompt}}}
			})
			worst, started := up.WorstMinute()
			assert.Equal(t, started, run.ok)
			assert.Equal(t, 300, run.ok+run.refused, "served or refused for the budget")
			require.Positive(t, run.ok)
			assert.LessOrEqual(t, worst, int64(perMinute+started*maxError), "the budget and the errors of the requests started")
			each := worst / int64(run.ok) // about the same each
			t.Logf("estimates short by up to %d: %d served, %d refused; the upstream's worst minute %d of %d tokens (at most %d)",
				maxError, run.ok, run.refused, worst, perMinute, perMinute+started*maxError)
			assert.Greater(t, worst, int64(perMinute)-each, "the budget is used")
		})
	}
}

// minuteUpstream starts a simulated upstream that counts the tokens
// started in each minute and refuses nothing.
func minuteUpstream(t *testing.T) (*simulated.Provider, string) {
	up := simulated.New(10_000)
	require.NoError(t, up.SetTokensPerMinute(1_000_000))
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	return up, srv.URL
}

// budgetFleet starts three gateways on store sharing a provider's budget
// of perMinute tokens a minute in it, with extra fields of the config
// ("" or ending in a comma), and returns their URLs. The store's calls
// may take 5 s, and so may a request's wait: under a flood of requests
// at once, under -race, calls at Redis's default of 500 ms timed out, the
// breaker opened, and "closed" answered 503.
func budgetFleet(t *testing.T, upstreamURL, store string, perMinute int, extra string) []string {
	format := `{
		"upstream": "%s",
		"orgs": {"default_limit": 10000},` + extra + `
		"provider": {"tokens_per_minute": ` + strconv.Itoa(perMinute) + `, "max_queue": 2000, "max_queue_wait_ms": 5000},
		"fleet": {` + store + `, "on_unavailable": "closed", "timeout_ms": 5000}
	}`
	var urls []string
	for range 3 {
		srv, _ := startGatewayWith(t, upstreamURL, format)
		urls = append(urls, srv.URL)
	}
	return urls
}
