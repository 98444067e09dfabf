package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	simulated "github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// budgetRun is what a flood of requests through the gateway got.
type budgetRun struct {
	ok, refused, other int
	refusedBy          map[string]int // the refusals by the cap they name
	usageSeen          int            // answers that carried a usage chunk to the client
	firstRetry         string
	limitHeader        string
}

// flood sends n streamed requests at once, each built by body(i), and
// reads every answer to its end.
func flood(t *testing.T, url string, n int, body func(i int) map[string]any) budgetRun {
	run := floodAll(t, []string{url}, n, body)
	for capName := range run.refusedBy {
		assert.Equal(t, pacing.CapTokensPerMinute, capName, "refused by the budget alone")
	}
	return run
}

// floodAll is flood over several gateways, request i to urls[i%len(urls)].
func floodAll(t *testing.T, urls []string, n int, body func(i int) map[string]any) budgetRun {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	var mu sync.Mutex
	run := budgetRun{refusedBy: map[string]int{}}
	var wg sync.WaitGroup
	for i := range n {
		b, err := json.Marshal(body(i))
		require.NoError(t, err)
		wg.Go(func() {
			resp, err := client.Post(urls[i%len(urls)]+"/v1/chat/completions", "application/json", bytes.NewReader(b))
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			assert.NoError(t, err)
			mu.Lock()
			defer mu.Unlock()
			switch resp.StatusCode {
			case http.StatusOK:
				run.ok++
				if bytes.Contains(got, []byte(`"usage"`)) {
					run.usageSeen++
				}
				run.limitHeader = resp.Header.Get("X-Ratelimit-Limit-Tokens")
			case http.StatusTooManyRequests:
				run.refused++
				run.refusedBy[resp.Header.Get(CapHeader)]++
				if resp.Header.Get(CapHeader) == pacing.CapTokensPerMinute {
					assert.Contains(t, string(got), "over the tokens_per_minute budget")
					assert.Contains(t, string(got), `"over_budget"`)
				}
				if run.firstRetry == "" {
					run.firstRetry = resp.Header.Get("Retry-After")
				}
			default:
				run.other++
				t.Errorf("status %d: %s", resp.StatusCode, got)
			}
		})
	}
	wg.Wait()
	return run
}

// A provider's budget of tokens per minute, the same at the simulated
// upstream and in the gateway: 1,000 requests sent at once, streamed, that
// do not ask for their usage. The upstream never refuses one for its
// budget and never sees more than the budget start in a minute; those the
// gateway cannot start within their wait are answered 429 at once, naming
// the budget, with a Retry-After from its refill. The gateway asks each
// stream for its usage, settles the budget with it, and keeps the usage
// chunk from the clients, who did not ask.
func TestGatewayKeepsAProviderUnderItsTokenBudget(t *testing.T) {
	const perMinute = 20_000
	up := simulated.New(10_000)
	require.NoError(t, up.SetTokensPerMinute(perMinute))
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	srv, gw := startGatewayWith(t, upSrv.URL, `{
		"upstream": "%s",
		"orgs": {"default_limit": 10000},
		"tokens": {"expected_output": 50},
		"provider": {"tokens_per_minute": `+strconv.Itoa(perMinute)+`, "max_queue": 2000, "max_queue_wait_ms": 1000}
	}`)
	prompt := strings.Repeat("hello world ", 40) // 80 tokens, 84 with its message
	run := flood(t, srv.URL, 1000, func(int) map[string]any {
		return map[string]any{"model": "glm-5", "stream": true, "turn_ms": 40,
			"messages": []map[string]string{{"role": "user", "content": prompt}}}
	})
	c := up.Counts()
	worst, started := up.WorstMinute()
	assert.Zero(t, c.Refused, "the upstream refused nothing")
	assert.LessOrEqual(t, worst, int64(perMinute), "no minute over the budget at the upstream")
	assert.Equal(t, 1000, run.ok+run.refused)
	assert.Equal(t, started, run.ok)
	assert.Zero(t, run.usageSeen, "the usage chunk the gateway asked for is not passed on")
	assert.Equal(t, strconv.Itoa(perMinute), run.limitHeader)
	retry, err := strconv.Atoi(run.firstRetry)
	require.NoError(t, err)
	assert.Greater(t, retry, 30, "refused until the budget refills")
	// Each request is estimated at 134 tokens and uses about 86: at least
	// as many as the estimates fit start, and more when answers come back
	// while the others still arrive (this depends on the machine).
	assert.GreaterOrEqual(t, run.ok, perMinute/134, "the budget is used")
	b := gw.gate.Budgets()
	require.Len(t, b, 1)
	text := scrape(t, &http.Client{}, srv.URL)
	assert.Contains(t, text, fmt.Sprintf(`inflight_budget_tokens_limit{budget="tokens_per_minute",cap="provider"} %d`, perMinute))
	assert.Contains(t, text, `inflight_budget_tokens_left{budget="tokens_per_minute",cap="provider"}`)
	t.Logf("%d served, %d refused (Retry-After %ss); the upstream's worst minute %d of %d tokens; the budget has %d left",
		run.ok, run.refused, run.firstRetry, worst, perMinute, b[0].Left)
}

// A flood of max_tokens 1, whose estimates are exact: the upstream sees
// no more than the budget start in the minute, and the budget is used.
// Then a budget's first request passes though it is larger than the
// budget, and the next waits for the refill.
func TestGatewayTokenBudgetMaxTokensOne(t *testing.T) {
	const perMinute = 5000
	up := simulated.New(10_000)
	require.NoError(t, up.SetTokensPerMinute(1_000_000)) // counts, refuses nothing
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	config := `{
		"upstream": "%s",
		"orgs": {"default_limit": 10000},
		"provider": {"tokens_per_minute": ` + strconv.Itoa(perMinute) + `, "max_queue": 2000, "max_queue_wait_ms": 500}
	}`
	srv, _ := startGatewayWith(t, upSrv.URL, config)
	prompt := strings.Repeat("hello world ", 20)
	run := flood(t, srv.URL, 500, func(int) map[string]any {
		return map[string]any{"model": "glm-5", "stream": true, "turn_ms": 1000, "max_tokens": 1,
			"messages": []map[string]string{{"content": prompt}}}
	})
	worst, started := up.WorstMinute()
	assert.LessOrEqual(t, worst, int64(perMinute))
	assert.Equal(t, started, run.ok)
	require.Positive(t, run.ok)
	each := worst / int64(run.ok) // all alike: 46 tokens at the upstream
	assert.Less(t, perMinute-worst, each, "exact estimates: the budget is used to the last whole request")
	t.Logf("max_tokens 1: %d served, %d refused; the upstream's worst minute %d of %d tokens", run.ok, run.refused, worst, perMinute)

	up.ResetMinute()
	srv, _ = startGatewayWith(t, upSrv.URL, config)
	first := flood(t, srv.URL, 1, func(int) map[string]any {
		return map[string]any{"model": "glm-5", "stream": true, "turn_ms": 10, "max_tokens": 1,
			"messages": []map[string]string{{"content": strings.Repeat("hello world ", 3000)}}}
	})
	assert.Equal(t, 1, first.ok, "the first request passes: 6,005 tokens against 5,000")
	next := flood(t, srv.URL, 1, func(int) map[string]any {
		return map[string]any{"model": "glm-5", "stream": true, "max_tokens": 1, "messages": []map[string]string{{"content": "hello"}}}
	})
	assert.Equal(t, 1, next.refused, "the next waits for the refill")
	_, started = up.WorstMinute()
	assert.Equal(t, 1, started)
}

// An org's own token budget: a request over it is answered 429 at once,
// naming the tenant's budget, and charges nothing; what the answers did
// not use comes back when they report their usage; an org without a
// budget is not held to one.
func TestGatewayOrgTokenBudget(t *testing.T) {
	up := simulated.New(100)
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	srv, _ := startGatewayWith(t, upSrv.URL, `{
		"upstream": "%s",
		"orgs": {"default_limit": 10, "budgets": {"org-a": {"tokens_per_minute": 300}}},
		"tokens": {"expected_output": 100}
	}`)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	send := func(org string, turnMS int) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"glm-5","stream":true,"turn_ms":%d,"messages":[{"content":"hello world"}]}`, turnMS)))
		require.NoError(t, err)
		req.Header.Set(OrgHeader, org)
		resp, err := client.Do(req)
		require.NoError(t, err)
		return resp, ""
	}
	// Two requests of 106 estimated tokens in flight; a third would pass 300.
	a, _ := send("org-a", 300)
	b, _ := send("org-a", 300)
	c, _ := send("org-a", 10)
	body, err := io.ReadAll(c.Body)
	require.NoError(t, err)
	c.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, c.StatusCode)
	assert.Equal(t, "tenant_tokens_per_minute", c.Header.Get(CapHeader))
	assert.NotEmpty(t, c.Header.Get("Retry-After"))
	assert.Contains(t, string(body), "over the tenant_tokens_per_minute budget: 212 of 300 tokens")
	other, _ := send("org-b", 10)
	_, err = io.Copy(io.Discard, other.Body)
	require.NoError(t, err)
	other.Body.Close()
	assert.Equal(t, http.StatusOK, other.StatusCode, "org-b has no budget")

	for _, r := range []*http.Response{a, b} { // each used 6 + 15 tokens
		got, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		r.Body.Close()
		assert.NotContains(t, string(got), `"usage"`, "the client did not ask for it")
	}
	d, _ := send("org-a", 10)
	_, err = io.Copy(io.Discard, d.Body)
	require.NoError(t, err)
	d.Body.Close()
	assert.Equal(t, http.StatusOK, d.StatusCode, "the answers' usage returned what they did not use")
}

// Three gateways on one store (Redis, PostgreSQL) share the provider's
// budget per minute and an org's: 600 requests sent at once over the
// three never draw a refusal from the simulated upstream's budget of the
// same size, which never sees more start in a minute; an org's requests
// through any gateway are held to its budget. With on_unavailable
// "closed", a call to the store that times out under the flood (on
// PostgreSQL, 600 requests at once queue for one budget's lock and the
// provider key's, on a busy machine for longer than the 500 ms a call
// may take) is answered 503 rather than let through uncounted.
func TestGatewayFleetTokenBudget(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) { testGatewayFleetTokenBudget(t, store(t)) })
	}
}

func testGatewayFleetTokenBudget(t *testing.T, store string) {
	const perMinute = 20_000
	up := simulated.New(10_000)
	require.NoError(t, up.SetTokensPerMinute(perMinute))
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	format := `{
		"upstream": "%s",
		"orgs": {"default_limit": 10000, "budgets": {"org-a": {"tokens_per_minute": 1000}}},
		"tokens": {"expected_output": 50},
		"provider": {"tokens_per_minute": ` + strconv.Itoa(perMinute) + `, "max_queue": 2000, "max_queue_wait_ms": 1000},
		"fleet": {` + store + `, "on_unavailable": "closed"}
	}`
	var urls []string
	for range 3 {
		srv, _ := startGatewayWith(t, upSrv.URL, format)
		urls = append(urls, srv.URL)
	}
	prompt := strings.Repeat("hello world ", 40) // 84 tokens with its message; 134 estimated
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 600}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	var limitSeen string // an answer's X-Ratelimit-Limit-Tokens
	send := func(url, org string) (int, string) {
		b, err := json.Marshal(map[string]any{"model": "glm-5", "stream": true, "turn_ms": 40,
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set(OrgHeader, org)
		resp, err := client.Do(req)
		if !assert.NoError(t, err) {
			return 0, ""
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		assert.NoError(t, err)
		if org == "org-a" && resp.StatusCode == http.StatusOK {
			limitSeen = resp.Header.Get("X-Ratelimit-Limit-Tokens")
		}
		return resp.StatusCode, resp.Header.Get(CapHeader)
	}

	// org-a, one request after another, through the three gateways.
	served := 0
	for i := range 16 {
		status, capName := send(urls[i%3], "org-a")
		switch status {
		case http.StatusOK:
			served++
		case http.StatusTooManyRequests:
			assert.Equal(t, "tenant_tokens_per_minute", capName)
		default:
			t.Errorf("status %d", status)
		}
	}
	assert.GreaterOrEqual(t, served, 1000/134, "what its estimates fit")
	assert.LessOrEqual(t, served, 1000/84+1, "no more than its usage fits")
	assert.Equal(t, "1000", limitSeen, "the answers tell the tightest of the fleet's budgets: the org's")

	var mu sync.Mutex
	counts := map[int]int{}
	refusedBy := map[string]int{}
	var wg sync.WaitGroup
	for i := range 600 {
		wg.Go(func() {
			status, capName := send(urls[i%3], "org-b")
			mu.Lock()
			counts[status]++
			if status == http.StatusTooManyRequests {
				refusedBy[capName]++
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	worst, started := up.WorstMinute()
	c := up.Counts()
	assert.Zero(t, c.Refused, "the upstream refused nothing")
	assert.LessOrEqual(t, worst, int64(perMinute), "no minute over the budget at the upstream")
	assert.Equal(t, 600, counts[http.StatusOK]+counts[http.StatusTooManyRequests]+counts[http.StatusServiceUnavailable],
		"served, refused, or the store unavailable; nothing else")
	assert.Equal(t, started, served+counts[http.StatusOK])
	for capName := range refusedBy { // the provider's budget ("tokens_per_minute") or its queue's wait ("provider")
		assert.Contains(t, []string{"tokens_per_minute", pacing.CapProvider}, capName, "org-b has no budget of its own, its model none")
	}
	t.Logf("org-a: %d of 16 served; then %d served, %d refused (by %v), %d store unavailable over 3 gateways; the upstream's worst minute %d of %d tokens",
		served, counts[http.StatusOK], counts[http.StatusTooManyRequests], refusedBy, counts[http.StatusServiceUnavailable], worst, perMinute)

	// /metrics shows the fleet's provider budget as the store last
	// answered each gateway: its limit, and less than all of it left after
	// the burst (below zero in debt).
	for _, url := range urls {
		text := scrape(t, &http.Client{}, url)
		assert.Contains(t, text, fmt.Sprintf(`inflight_budget_tokens_limit{budget="tokens_per_minute",cap="provider"} %d`, perMinute))
		m := regexp.MustCompile(`inflight_budget_tokens_left\{budget="tokens_per_minute",cap="provider"\} (\S+)`).FindStringSubmatch(text)
		if assert.NotNil(t, m, "the fleet budget's left") {
			left, err := strconv.ParseFloat(m[1], 64)
			require.NoError(t, err)
			assert.Less(t, left, float64(perMinute), "%s: the burst is counted", url)
		}
	}
}

// A fleet's budgets while its Redis is stopped (SIGSTOP): by default,
// requests go through uncounted; with on_unavailable "closed", they are
// answered 503; once Redis is back, budgets count again.
func TestGatewayFleetBudgetStoreDown(t *testing.T) {
	for _, closed := range []bool{false, true} {
		t.Run(fmt.Sprintf("closed=%v", closed), func(t *testing.T) {
			redisSrv := redistest.Start(t)
			up := simulated.New(100)
			upSrv := httptest.NewServer(up)
			t.Cleanup(upSrv.Close)
			mode := "local"
			if closed {
				mode = "closed"
			}
			srv, _ := startGatewayWith(t, upSrv.URL, `{
				"upstream": "%s",
				"orgs": {"default_limit": 100},
				"provider": {"tokens_per_minute": 100000},
				"fleet": {"redis_url": "redis://`+redisSrv.Addr+`/0", "on_unavailable": "`+mode+`"}
			}`)
			client := &http.Client{Transport: &http.Transport{}}
			t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
			send := func() int {
				resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"glm-5","stream":true,"turn_ms":10,"messages":[{"content":"hello"}]}`))
				require.NoError(t, err)
				defer resp.Body.Close()
				_, err = io.Copy(io.Discard, resp.Body)
				require.NoError(t, err)
				if resp.StatusCode == http.StatusServiceUnavailable { // when to come back, as the fleet estimates it
					assert.GreaterOrEqual(t, assertRetryAfter(t, resp.Header), 250)
				}
				return resp.StatusCode
			}
			require.Equal(t, http.StatusOK, send())
			redisSrv.Stop()
			want := http.StatusOK
			if closed {
				want = http.StatusServiceUnavailable
			}
			for range 6 { // past the breaker's 3 failures, then at once
				assert.Equal(t, want, send())
			}
			redisSrv.Cont()
			waitFor(t, "budgets count again", func() bool { return send() == http.StatusOK })
		})
	}
}

// Any org name of up to 256 bytes names a fleet budget: quoted, or
// hashed when quoting makes it too long.
func TestOrgBudgetName(t *testing.T) {
	assert.Equal(t, `org:"org-a"`, orgBudgetName("org-a"))
	long := orgBudgetName(strings.Repeat("\xff", 256))
	assert.Len(t, long, 4+64)
	for _, org := range []string{"org-a", strings.Repeat("\xff", 256), strings.Repeat("é", 128)} {
		_, err := fleet.NewBudget(memstore.New(), orgBudgetName(org), pacing.BudgetLimits{TokensPerMinute: 1}, 0)
		assert.NoError(t, err, "%q", org)
	}
}
