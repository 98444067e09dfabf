package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every refusal by a budget is counted once in inflight_rejected_total,
// under the cap that refused it, with a fleet as without one. Before, with
// a fleet, whose store keeps the provider's and the models' budgets, their
// refusals were answered 429 and named, but counted nowhere (rejectBudget
// counted an org's alone).
func TestBudgetRefusalsCountedOnce(t *testing.T) {
	for _, tc := range []struct{ name, fleet string }{{"local", ""}, {"redis", "redis"}} {
		t.Run(tc.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":60,"completion_tokens":40}}`)
			}))
			t.Cleanup(up.Close)
			fleetCfg := ""
			if tc.fleet != "" {
				fleetCfg = `, "fleet": {` + fleetStores[tc.fleet](t) + `}`
			}
			srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s",
				"tokens": {"expected_output": 50},
				"orgs": {"default_limit": 10, "budgets": {"org-b": {"tokens_per_minute": 200}}},
				"provider": {"max_queue_wait_ms": 50, "tokens_per_minute": 1000, "models": {"m2": {"tokens_per_minute": 200}}}`+fleetCfg+`}`)
			refused := 0
			send := func(org, model string) {
				resp, e := postBody(t, srv.Client(), srv.URL, org, `{"model":"`+model+`","messages":[{"content":"hello"}]}`)
				if resp.StatusCode == http.StatusTooManyRequests {
					refused++
					assert.Equal(t, "over_budget", e.Error.Reason)
					assert.Equal(t, resp.Header.Get(CapHeader), e.Error.Cap)
					assertRetryAfter(t, resp.Header)
				}
			}
			for range 6 {
				send("org-b", "m3") // the org's budget
			}
			for range 14 {
				send("org-a", "m2") // the model's
			}
			for range 14 {
				send("org-a", "m") // the provider's
			}
			require.Positive(t, refused)
			total := 0
			for _, l := range strings.Split(scrape(t, srv.Client(), srv.URL), "\n") {
				if strings.HasPrefix(l, "inflight_rejected_total{") && strings.Contains(l, `reason="over_budget"`) {
					f := strings.Fields(l)
					n, err := strconv.Atoi(f[len(f)-1])
					require.NoError(t, err)
					total += n
				}
			}
			assert.Equal(t, refused, total, "each budget refusal counted once in inflight_rejected_total")
		})
	}
}

// A streamed request sent as curl -d sends it (Content-Type
// application/x-www-form-urlencoded, as in the README's examples) is read
// as JSON by the gateway, and goes on as JSON: the stream is asked for its
// usage, and the org's budget settles with it. Before, pacing's rewrite
// skipped a body not declared JSON, and the budget kept the whole estimate.
func TestFormContentTypeStreamSettlesWithUsage(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		if strings.Contains(string(b), `"include_usage":true`) {
			io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	srv, g := startGatewayWith(t, up.URL, `{"upstream": "%s", "orgs": {"default_limit": 10, "budget": {"tokens_per_minute": 100000}}, "tokens": {"expected_output": 100}}`)
	for _, ct := range []string{"application/json", "application/x-www-form-urlencoded"} {
		before := orgLeft(t, g, "org-"+ct)
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"content":"hi"}]}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", ct)
		req.Header.Set(OrgHeader, "org-"+ct)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		assert.NotContains(t, string(body), `"usage"`, ct)
		assert.Equal(t, before-5, orgLeft(t, g, "org-"+ct), "%s: settled with the usage (3+2), not the estimate", ct)
	}
}
