package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func scrape(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// TestMetricsUnderLoad scrapes /metrics while requests wait for the
// provider: every cap is a series of the same families, labelled by cap.
func TestMetricsUnderLoad(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 10},
	"provider": {"max_concurrent_requests": 2, "models": {"glm-5.3": {"max_concurrent_requests": 2}},
	             "api_keys": [{"id": "k1", "max_concurrent_requests": 2}]}
}`)
	client := srv.Client()
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			resp, err := post(context.Background(), t, client, srv.URL, []string{"org-a", "org-b"}[i%2], "glm-5.3")
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.True(t, strings.HasSuffix(string(b), "data: [DONE]\n\n"))
		})
	}
	waitFor(t, "two stream and three wait for the provider", func() bool {
		st := gw.gate.Status()
		return st.InFlight == 2 && st.Queued == 3
	})
	text := scrape(t, client, srv.URL)
	for _, want := range []string{
		`inflight_waiting{cap="provider"} 3`,
		`inflight_in_flight{cap="provider"} 2`,
		`inflight_limit{cap="provider"} 2`,
		`inflight_in_flight{cap="model:glm-5.3"} 2`,
		`inflight_limit{cap="model:glm-5.3"} 2`,
		`inflight_in_flight{cap="api_key:k1"} 2`,
		`inflight_in_flight{cap="tenant"} 5`,
		`inflight_keys{cap="tenant"} 2`,
		`inflight_rejected_total{cap="tenant",reason="limit_reached"} 0`,
		`inflight_rejected_total{cap="provider",reason="queue_full"} 0`,
		"go_goroutines ",
		"process_open_fds ",
	} {
		assert.Contains(t, text, want+"")
	}
	assert.NotContains(t, text, "inflight_tenant_", "one family per metric, not one per cap")
	assert.NotContains(t, text, "org-a", "no tenant names in the metrics")

	close(u.gate)
	wg.Wait()
	waitFor(t, "all released", func() bool { return gw.tenants.Keys() == 0 && gw.gate.Status().InFlight == 0 })
	text = scrape(t, client, srv.URL)
	for _, want := range []string{
		`inflight_acquired_total{cap="provider"} 5`,
		`inflight_released_total{cap="provider"} 5`,
		`inflight_wait_seconds_count{cap="provider"} 5`,
		`inflight_hold_seconds_count{cap="provider"} 5`,
		`inflight_hold_seconds_count{cap="tenant"} 5`,
		`inflight_waiting{cap="provider"} 0`,
	} {
		assert.Contains(t, text, want)
	}
}
