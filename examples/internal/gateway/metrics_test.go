package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
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

// streamAll posts n streamed requests for model at once, each from one of
// two orgs, and reports each one that has been relayed to its end on done.
func streamAll(t *testing.T, wg *sync.WaitGroup, client *http.Client, url, model string, n int, done chan<- struct{}) {
	for i := range n {
		wg.Go(func() {
			resp, err := post(context.Background(), t, client, url, []string{"org-a", "org-b"}[i%2], model)
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.True(t, strings.HasSuffix(string(b), "data: [DONE]\n\n"))
			done <- struct{}{}
		})
	}
}

// TestMetricsUnderLoad scrapes /metrics while requests stream and wait:
// every cap is a series of the same families, labelled by cap, and the
// provider's, a model's and an API key's series move with the load.
func TestMetricsUnderLoad(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 10},
	"provider": {"max_concurrent_requests": 4, "max_queue": 3, "models": {"glm-5.3": {"max_concurrent_requests": 2}},
	             "api_keys": [{"id": "k1", "max_concurrent_requests": 4}]}
}`)
	client := srv.Client()
	var wg sync.WaitGroup
	done := make(chan struct{}, 5)
	streamAll(t, &wg, client, srv.URL, "glm-5.3", 5, done)
	waitFor(t, "two stream and three wait for the model's cap", func() bool {
		st := gw.gate.Status()
		return st.InFlight == 2 && st.Queued == 3
	})
	// The handlers record a grant's wait after the Gate has counted it: the
	// API key's last.
	waitFor(t, "the two grants' waits are recorded", func() bool {
		return strings.Contains(scrape(t, client, srv.URL), `inflight_wait_seconds_count{cap="api_key:k1"} 2`)
	})
	resp, e := postBody(t, client, srv.URL, "org-c", `{"model":"glm-5.3","stream":true}`)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "the queue is full: %v", e)
	// The answer names the cap that refused, and why.
	assert.Equal(t, "provider", resp.Header.Get(CapHeader))
	assert.Equal(t, "provider", e.Error.Cap)
	assert.Equal(t, "queue_full", e.Error.Reason)

	text := scrape(t, client, srv.URL)
	for _, want := range []string{
		`inflight_waiting{cap="provider"} 3`,
		`inflight_in_flight{cap="provider"} 2`,
		`inflight_limit{cap="provider"} 4`,
		`inflight_wait_seconds_count{cap="provider"} 2`,
		`inflight_rejected_total{cap="provider",reason="queue_full"} 1`,
		`inflight_waiting{cap="model:glm-5.3"} 3`,
		`inflight_in_flight{cap="model:glm-5.3"} 2`,
		`inflight_limit{cap="model:glm-5.3"} 2`,
		`inflight_wait_seconds_count{cap="model:glm-5.3"} 2`,
		// Counted once, under the cap that refused: the provider's queue.
		`inflight_rejected_total{cap="model:glm-5.3",reason="queue_full"} 0`,
		`inflight_rejected_total{cap="model:glm-5.3",reason="wait_timeout"} 0`,
		`inflight_in_flight{cap="model:other"} 0`,
		`inflight_waiting{cap="model:other"} 0`,
		`inflight_limit{cap="model:other"} +Inf`,
		`inflight_rejected_total{cap="model:other",reason="queue_full"} 0`,
		`inflight_in_flight{cap="api_key:k1"} 2`,
		`inflight_limit{cap="api_key:k1"} 4`,
		`inflight_in_flight{cap="api_keys"} 2`,
		`inflight_limit{cap="api_keys"} 4`,
		`inflight_rejected_total{cap="api_keys",reason="wait_timeout"} 0`,
		`inflight_wait_seconds_count{cap="api_key:k1"} 2`,
		`inflight_in_flight{cap="tenant"} 5`,
		`inflight_keys{cap="tenant"} 2`,
		`inflight_rejected_total{cap="tenant",reason="limit_reached"} 0`,
		"go_goroutines ",
		"process_open_fds ",
	} {
		assert.Contains(t, text, want)
	}
	// A key is chosen when a request starts: it has no waiters and refuses
	// nobody, and its series do not pretend otherwise.
	assert.NotContains(t, text, `inflight_waiting{cap="api_key:k1"}`)
	assert.NotContains(t, text, `inflight_rejected_total{cap="api_key:k1"`)
	assert.NotContains(t, text, "inflight_tenant_", "one family per metric, not one per cap")
	assert.NotContains(t, text, "org-a", "no tenant names in the metrics")

	u.gate <- struct{}{} // one stream ends; a waiter takes its place
	<-done
	waitFor(t, "the first waiter streams", func() bool { return gw.gate.Status().Queued == 2 })
	text = scrape(t, client, srv.URL)
	for _, cap := range []string{"provider", "model:glm-5.3", "api_key:k1"} {
		assert.Contains(t, text, `inflight_hold_seconds_count{cap="`+cap+`"} 1`)
		assert.Contains(t, text, `inflight_wait_seconds_count{cap="`+cap+`"} 3`)
		assert.Contains(t, text, `inflight_in_flight{cap="`+cap+`"} 2`)
	}
	assert.Contains(t, text, `inflight_waiting{cap="model:glm-5.3"} 2`)

	close(u.gate)
	wg.Wait()
	waitFor(t, "all released", func() bool { return gw.tenants.Keys() == 0 && gw.gate.Status().InFlight == 0 })
	text = scrape(t, client, srv.URL)
	for _, cap := range []string{"provider", "model:glm-5.3", "api_key:k1"} {
		assert.Contains(t, text, `inflight_acquired_total{cap="`+cap+`"} 5`)
		assert.Contains(t, text, `inflight_released_total{cap="`+cap+`"} 5`)
		assert.Contains(t, text, `inflight_wait_seconds_count{cap="`+cap+`"} 5`)
		assert.Contains(t, text, `inflight_hold_seconds_count{cap="`+cap+`"} 5`)
		assert.Contains(t, text, `inflight_in_flight{cap="`+cap+`"} 0`)
	}
	assert.Contains(t, text, `inflight_hold_seconds_count{cap="tenant"} 6`, "the request turned away held its tenant slot too")
	assert.Contains(t, text, `inflight_waiting{cap="provider"} 0`)
	assert.Contains(t, text, `inflight_waiting{cap="model:glm-5.3"} 0`)
	assert.NotContains(t, text, `cap="model:other"} 1`, "nothing was asked of other models")
}

// capLabels returns the values of the label cap in a scrape.
func capLabels(text string) []string {
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`cap="([^"]*)"`).FindAllStringSubmatch(text, -1) {
		seen[m[1]] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// Model names come from request bodies: the ones the config does not name
// share one series, however many a client makes up.
func TestMetricsFoldUnnamedModels(t *testing.T) {
	u := newUpstream(t)
	close(u.gate)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 10},
	"provider": {"max_concurrent_requests": 4, "models": {"glm-5.3": {"max_concurrent_requests": 2}}}
}`)
	client := srv.Client()
	const n = 40
	for i := range n {
		resp, e := postBody(t, client, srv.URL, "org-a", fmt.Sprintf(`{"model":"made-up-%d","stream":true}`, i))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%v", e)
	}
	waitFor(t, "all released", func() bool { return gw.gate.Status().InFlight == 0 })
	text := scrape(t, client, srv.URL)
	assert.Equal(t, []string{"model:glm-5.3", "model:other", "provider", "tenant"}, capLabels(text))
	assert.NotContains(t, text, "made-up")
	assert.Contains(t, text, fmt.Sprintf(`inflight_acquired_total{cap="model:other"} %d`, n))
	assert.Contains(t, text, fmt.Sprintf(`inflight_hold_seconds_count{cap="model:other"} %d`, n))
	assert.Contains(t, text, `inflight_acquired_total{cap="model:glm-5.3"} 0`)
}

// A model that is called "other" keeps a series of its own, apart from
// the unnamed models'.
func TestMetricsModelNamedOther(t *testing.T) {
	u := newUpstream(t)
	close(u.gate)
	srv, _ := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"provider": {"models": {"other": {"max_concurrent_requests": 3}}}
}`)
	resp, e := postBody(t, srv.Client(), srv.URL, "org-a", `{"model":"glm-4","stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", e)
	text := scrape(t, srv.Client(), srv.URL)
	assert.Contains(t, text, `inflight_limit{cap="model:other"} 3`)
	assert.Contains(t, text, `inflight_acquired_total{cap="model:other"} 0`)
	assert.Contains(t, text, `inflight_acquired_total{cap="model:other (unnamed)"} 1`)
}

// inflight_fleet_degraded is 1 exactly while Redis is held unavailable and
// admissions go on without it, and back to 0 once it answers again.
func TestMetricsFleetDegraded(t *testing.T) {
	redisSrv := redistest.Start(t)
	proxy := redistest.StartProxy(t, redisSrv)
	u := newUpstream(t)
	close(u.gate)
	srv, gw := startGatewayWith(t, u.srv.URL, `{"upstream": "%s",
	"orgs": {"default_limit": 10},
	"provider": {"max_concurrent_requests": 4},
	"fleet": {"redis_url": "redis://`+proxy.Addr+`/0", "on_unavailable": "local"}}`)
	client := srv.Client()
	resp, e := postBody(t, client, srv.URL, "org-a", `{"model":"glm-5.3","stream":true}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", e)
	text := scrape(t, client, srv.URL)
	for _, fl := range []string{"tenants", "provider"} {
		assert.Contains(t, text, `inflight_fleet_degraded{fleet="`+fl+`"} 0`)
		assert.Contains(t, text, `inflight_fleet_redis_unavailable{fleet="`+fl+`"} 0`)
	}

	proxy.Cut()
	unavailable := func() bool { return gw.fleetTenants.Stats().BreakerOpen && gw.caps.Stats().BreakerOpen }
	for i := 0; i < 20 && !unavailable(); i++ {
		resp, e := postBody(t, client, srv.URL, "org-a", `{"model":"glm-5.3","stream":true}`)
		require.Equal(t, http.StatusOK, resp.StatusCode, "admitted under the local caps: %v", e)
	}
	require.True(t, unavailable(), "failed calls open the breakers")
	text = scrape(t, client, srv.URL)
	for _, fl := range []string{"tenants", "provider"} {
		assert.Contains(t, text, `inflight_fleet_degraded{fleet="`+fl+`"} 1`)
		assert.Contains(t, text, `inflight_fleet_redis_unavailable{fleet="`+fl+`"} 1`)
		assert.NotContains(t, text, `inflight_fleet_degraded_admissions_total{fleet="`+fl+`"} 0`)
	}

	proxy.Heal()
	waitFor(t, "a probe closes the breakers", func() bool {
		return !gw.fleetTenants.Stats().BreakerOpen && !gw.caps.Stats().BreakerOpen
	})
	text = scrape(t, client, srv.URL)
	for _, fl := range []string{"tenants", "provider"} {
		assert.Contains(t, text, `inflight_fleet_degraded{fleet="`+fl+`"} 0`)
		assert.Contains(t, text, `inflight_fleet_redis_unavailable{fleet="`+fl+`"} 0`)
	}
}

// With on_unavailable "closed" an unavailable Redis refuses admissions:
// they are not degraded, and the gauges tell the two apart.
func TestMetricsFleetClosedIsNotDegraded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	u := newUpstream(t)
	close(u.gate)
	srv, gw := startGatewayWith(t, u.srv.URL, `{"upstream": "%s",
		"fleet": {"redis_url": "redis://`+addr+`/0", "on_unavailable": "closed"}}`)
	var told []int
	for i := 0; i < 20 && !gw.fleetTenants.Stats().BreakerOpen; i++ {
		resp, _ := postBody(t, srv.Client(), srv.URL, "org-a", `{"model":"glm-5"}`)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		// As long as Redis has failed so far, from the probe interval
		// (250 ms) to 30 s, spread over half as long again.
		ms := assertRetryAfter(t, resp.Header)
		assert.GreaterOrEqual(t, ms, 250)
		assert.LessOrEqual(t, ms, 45000)
		told = append(told, ms)
	}
	t.Logf("retry-after-ms told while Redis could not be reached: %v", told)
	require.True(t, gw.fleetTenants.Stats().BreakerOpen, "failed calls open the breaker")
	text := scrape(t, srv.Client(), srv.URL)
	assert.Contains(t, text, `inflight_fleet_redis_unavailable{fleet="tenants"} 1`)
	assert.Contains(t, text, `inflight_fleet_degraded{fleet="tenants"} 0`)
}

// With a fleet, the model caps are shared on Redis and waited for before
// the Gate: a model's waiting counts those waits too.
func TestMetricsFleetModelWaiting(t *testing.T) {
	redisSrv := redistest.Start(t)
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, `{"upstream": "%s",
	"orgs": {"default_limit": 10},
	"provider": {"max_concurrent_requests": 4, "models": {"glm-5.3": {"max_concurrent_requests": 2}}},
	"fleet": {"redis_url": "redis://`+redisSrv.Addr+`/0"}}`)
	client := srv.Client()
	var wg sync.WaitGroup
	done := make(chan struct{}, 4)
	streamAll(t, &wg, client, srv.URL, "glm-5.3", 4, done)
	waitFor(t, "two stream and two wait for the shared model cap", func() bool {
		return u.get(u.cur, "all") == 2 && gw.caps.Stats().Waiting == 2
	})
	text := scrape(t, client, srv.URL)
	for _, want := range []string{
		`inflight_waiting{cap="provider"} 2`,
		`inflight_waiting{cap="model:glm-5.3"} 2`,
		`inflight_in_flight{cap="model:glm-5.3"} 2`,
		`inflight_limit{cap="model:glm-5.3"} 2`,
		`inflight_wait_seconds_count{cap="model:glm-5.3"} 2`,
	} {
		assert.Contains(t, text, want)
	}
	close(u.gate)
	wg.Wait()
	waitFor(t, "all released", func() bool { return gw.caps.Stats().Held == 0 && gw.TenantKeys() == 0 })
	text = scrape(t, client, srv.URL)
	assert.Contains(t, text, `inflight_waiting{cap="model:glm-5.3"} 0`)
	assert.Contains(t, text, `inflight_hold_seconds_count{cap="model:glm-5.3"} 4`)
}

// With provider.adaptive the provider's learned cap is exported, read from
// the Gate at each scrape, and each of its changes is logged: a probe over
// the cap that is not refused raises it.
func TestMetricsLearnedCap(t *testing.T) {
	u := newUpstream(t)
	log, logs := newTestLogger(slog.LevelInfo)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 10},
	"provider": {"max_concurrent_requests": 8, "adaptive": {"initial": 1, "retest_ms": 60000}}
}`, WithLogger(log))
	client := srv.Client()
	text := scrape(t, client, srv.URL)
	for _, want := range []string{
		`inflight_learned_cap{cap="provider",provider="provider"} 1`,
		`inflight_learned_limit{cap="provider",provider="provider"} 2`, // a probe may go
		`inflight_learned_ceiling{cap="provider",provider="provider"} 8`,
		`inflight_learned_floor{cap="provider",provider="provider"} 1`,
		`inflight_learned_max{cap="provider",provider="provider"} 8`,
		`inflight_learned_changes_total{cap="provider",provider="provider"} 1`,
		`inflight_upstream_answers_total{kind="concurrency",provider="provider"} 0`,
		`inflight_limit{cap="provider"} 2`, // the limit in force, not the configured ceiling
	} {
		assert.Contains(t, text, want)
	}

	var wg sync.WaitGroup
	done := make(chan struct{}, 2)
	streamAll(t, &wg, client, srv.URL, "glm-5.3", 2, done) // the second is the probe
	waitFor(t, "the probe raises the cap", func() bool { return gw.gate.Learned().Cap == 2 })
	text = scrape(t, client, srv.URL)
	assert.Contains(t, text, `inflight_learned_cap{cap="provider",provider="provider"} 2`)
	assert.Contains(t, text, `inflight_learned_changes_total{cap="provider",provider="provider"} 2`)
	for _, kind := range []string{"admitted", "concurrency", "rate", "overload", "quota", "other"} {
		assert.Regexp(t, `inflight_upstream_answers_total\{kind="`+kind+`",provider="provider"\} \d+`, text)
	}
	waitFor(t, "the change is logged", func() bool { return strings.Contains(logs.String(), "learned cap changed") })
	assert.Regexp(t, `level=INFO msg="gateway: learned cap changed" seq=2 provider=provider model="" api_key="" old=1 new=2 `+
		`old_ceiling=8 ceiling=8 evidence=\w+ in_flight_at_start=\d`, logs.String())

	close(u.gate)
	wg.Wait()
}

// With a fleet, provider.adaptive is learned on Redis, and exported as the
// Gate's is: a probe over the cap that is not refused raises it, and the
// change is logged.
func TestMetricsLearnedCapFleet(t *testing.T) {
	redisSrv := redistest.Start(t)
	u := newUpstream(t)
	log, logs := newTestLogger(slog.LevelInfo)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 10},
	"provider": {"max_concurrent_requests": 8, "adaptive": {"initial": 1, "retest_ms": 60000}},
	"fleet": {"redis_url": "redis://`+redisSrv.Addr+`/0"}
}`, WithLogger(log))
	client := srv.Client()
	text := scrape(t, client, srv.URL)
	for _, want := range []string{
		`inflight_learned_cap{cap="provider",provider="provider"} 1`,
		`inflight_learned_limit{cap="provider",provider="provider"} 2`, // a probe may go
		`inflight_learned_ceiling{cap="provider",provider="provider"} 8`,
		`inflight_learned_max{cap="provider",provider="provider"} 8`,
		`inflight_learned_changes_total{cap="provider",provider="provider"} 1`,
		`inflight_limit{cap="provider"} 2`,
	} {
		assert.Contains(t, text, want)
	}
	var wg sync.WaitGroup
	done := make(chan struct{}, 2)
	streamAll(t, &wg, client, srv.URL, "glm-5.3", 2, done) // the second is the probe
	waitFor(t, "the probe raises the cap", func() bool { return gw.Learned().Cap == 2 })
	text = scrape(t, client, srv.URL)
	assert.Contains(t, text, `inflight_learned_cap{cap="provider",provider="provider"} 2`)
	assert.Contains(t, text, `inflight_learned_changes_total{cap="provider",provider="provider"} 2`)
	assert.Regexp(t, `inflight_upstream_answers_total\{kind="admitted",provider="provider"\} [1-9]`, text)
	rec := httptest.NewRecorder()
	gw.debugProvider(rec, httptest.NewRequest(http.MethodGet, "/debug/provider", nil)) // served behind an admin token
	body := rec.Body.String()
	assert.Contains(t, body, `"learned":{"limit":4,"cap":2,"ceiling":8,"floor":1,"max":8,"changes":2}`, "the fleet's cap: 2, and a batch of two probes may go")
	assert.Regexp(t, `"answers":\{[^}]*"admitted":[1-9]`, body)
	waitFor(t, "the change is logged", func() bool { return strings.Contains(logs.String(), "fleet: learned cap changed") })
	assert.Regexp(t, `msg="fleet: learned cap changed" registry=\S+ key=provider old=1 new=2 old_ceiling=8 ceiling=8 by=`, logs.String())
	close(u.gate)
	wg.Wait()
}

// With fleet.learned_format 1 the learned cap's state goes to the store in
// format 1, which a release that reads only that format can share.
func TestFleetLearnedFormatOne(t *testing.T) {
	redisSrv := redistest.Start(t)
	u := newUpstream(t)
	_, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"provider": {"max_concurrent_requests": 8, "adaptive": {"initial": 1}},
	"fleet": {"redis_url": "redis://`+redisSrv.Addr+`/0", "learned_format": 1}
}`)
	ctx := context.Background()
	c := redisSrv.Client()
	var state string
	waitFor(t, "the learned state written", func() bool {
		keys, err := c.Keys(ctx, "*#learn:*").Result()
		if err != nil || len(keys) != 1 {
			return false
		}
		state = c.Get(ctx, keys[0]).Val()
		return state != ""
	})
	assert.Contains(t, state, `"f":1,`)
	assert.Contains(t, state, `"probe_n":`, "format 1's flat fields")
	assert.Equal(t, 1, gw.Learned().Cap)
}

// A wait that runs out on a model's cap is answered as the model's
// refusal and counted once, under the model; a tenant's refusal is the
// tenant's. With metrics.per_org, refusals are counted per org too;
// without it no series names an org.
func TestRefusalsNamedAndCountedOnce(t *testing.T) {
	for _, perOrg := range []bool{false, true} {
		u := newUpstream(t)
		metrics := ""
		if perOrg {
			metrics = `, "metrics": {"per_org": true}`
		}
		srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 10, "limits": {"org-t": 1}},
	"provider": {"max_concurrent_requests": 4, "max_queue_wait_ms": 50, "models": {"glm-5.3": {"max_concurrent_requests": 1}}}`+metrics+`
}`)
		client := srv.Client()
		var wg sync.WaitGroup
		done := make(chan struct{}, 1)
		streamAll(t, &wg, client, srv.URL, "glm-5.3", 1, done) // holds the model's one slot
		waitFor(t, "the model's slot is held", func() bool { return gw.gate.Status().InFlight == 1 })

		resp, e := postBody(t, client, srv.URL, "org-w", `{"model":"glm-5.3","stream":true}`)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "model", resp.Header.Get(CapHeader))
		assert.Equal(t, "model", e.Error.Cap)
		assert.Equal(t, "wait_timeout", e.Error.Reason)
		assert.Equal(t, "too many requests in flight under the model cap: 1 of 1, 0 queued (timed out waiting)", e.Error.Message)
		resp, _ = postBody(t, client, srv.URL, "", `{"model":"glm-5.3","stream":true}`) // no org: capped as "default"
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)

		// org-t's cap of 1, taken by a stream of another model.
		tdone := make(chan struct{}, 1)
		var twg sync.WaitGroup
		twg.Go(func() {
			resp, err := post(context.Background(), t, client, srv.URL, "org-t", "glm-4")
			if assert.NoError(t, err) {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			tdone <- struct{}{}
		})
		waitFor(t, "org-t's slot is held", func() bool { return gw.TenantKeys() == 2 })
		resp, e = postBody(t, client, srv.URL, "org-t", `{"model":"glm-4","stream":true}`)
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "tenant", resp.Header.Get(CapHeader))
		assert.Equal(t, "limit_reached", e.Error.Reason)

		text := scrape(t, client, srv.URL)
		assert.Contains(t, text, `inflight_rejected_total{cap="model:glm-5.3",reason="wait_timeout"} 2`)
		assert.Contains(t, text, `inflight_rejected_total{cap="provider",reason="wait_timeout"} 0`, "not counted twice")
		assert.Contains(t, text, `inflight_rejected_total{cap="tenant",reason="limit_reached"} 1`)
		if perOrg {
			assert.Contains(t, text, `inflight_org_rejected_total{cap="model",org="org-w",reason="wait_timeout"} 1`)
			assert.Contains(t, text, `inflight_org_rejected_total{cap="model",org="default",reason="wait_timeout"} 1`, "named as capped")
			assert.Contains(t, text, `inflight_org_rejected_total{cap="tenant",org="org-t",reason="limit_reached"} 1`)
		} else {
			assert.NotContains(t, text, "org-")
		}
		u.gate <- struct{}{} // the two streams end
		u.gate <- struct{}{}
		wg.Wait()
		twg.Wait()
		<-done
		<-tdone
	}
}
