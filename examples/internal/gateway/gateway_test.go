package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

func TestMain(m *testing.M) {
	// A gateway given no logger logs to slog.Default: without the access
	// line of each request, as before it was at info level.
	slog.SetLogLoggerLevel(slog.LevelWarn)
	redistest.Main(m, "examples/internal/gateway")
}

// upstream is a gated SSE model server that counts what it serves, in total,
// per model and per org, and the peaks.
type upstream struct {
	srv   *httptest.Server
	gate  chan struct{}
	mu    sync.Mutex
	cur   map[string]int
	peak  map[string]int
	order []string // the orgs of the requests, in the order they arrived
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{gate: make(chan struct{}), cur: map[string]int{}, peak: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"data":[{"id":"glm-5.3"}]}`)
			return
		}
		var body struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		names := []string{"all", "model:" + body.Model, "org:" + r.Header.Get("X-Org-ID")}
		u.enter(names)
		defer u.leave(names)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"delta\":\"a\"}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-u.gate:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) enter(names []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range names {
		u.cur[n]++
		u.peak[n] = max(u.peak[n], u.cur[n])
	}
	u.order = append(u.order, strings.TrimPrefix(names[2], "org:"))
}

func (u *upstream) arrived() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.order...)
}

func (u *upstream) leave(names []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range names {
		u.cur[n]--
	}
}

func (u *upstream) get(m map[string]int, name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return m[name]
}

// testAdminToken is the admin token of testConfig.
const testAdminToken = "test-admin-token-0123456789"

const testConfig = `{
	"upstream": "%s",
	"admin": {"token": "` + testAdminToken + `"},
	"orgs": {"default_limit": 3, "limits": {"org-a": 2}},
	"provider": {"max_concurrent_requests": 4, "models": {"glm-5.3": {"max_concurrent_requests": 2}}}
}`

func startGateway(t *testing.T, u *upstream) (*httptest.Server, *Gateway) {
	return startGatewayWith(t, u.srv.URL, testConfig)
}

// startGatewayWith starts a gateway whose config is format with the
// upstream's URL filled in.
func startGatewayWith(t *testing.T, upstreamURL, format string, opts ...Option) (*httptest.Server, *Gateway) {
	cfg, err := ParseConfig([]byte(fmt.Sprintf(format, upstreamURL)))
	require.NoError(t, err)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	gw, err := New(cfg, base, opts...)
	require.NoError(t, err)
	t.Cleanup(gw.Close)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return srv, gw
}

func post(ctx context.Context, t *testing.T, client *http.Client, url, org, model string) (*http.Response, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","stream":true}`))
	req.Header.Set("X-Org-ID", org)
	return client.Do(req)
}

// adminRequest makes an admin or debug request carrying the admin token.
func adminRequest(t *testing.T, method, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testAdminToken)
	return req
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "timed out waiting until %s", what)
		runtime.Gosched()
	}
}

func TestGatewayCapsUnderABurst(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGateway(t, u)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)

	var wg sync.WaitGroup
	codes := make(chan int, 10)
	for i := range 10 {
		org, model := "org-a", "glm-5.3"
		if i%2 == 1 {
			org, model = "org-b", "glm-4"
		}
		wg.Go(func() {
			resp, err := post(context.Background(), t, client, srv.URL, org, model)
			if !assert.NoError(t, err) {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	// org-a/glm-5.3 may have 2, org-b/glm-4 3: five admitted, five turned
	// away at once; the provider takes 4 and queues the fifth. The five
	// answers that have come are the rejections (the admitted wait for the
	// upstream): only then has every request arrived, and none can come
	// after the upstream lets the others go.
	waitFor(t, "the provider is full and the rest turned away", func() bool {
		return u.get(u.cur, "all") == 4 && gw.gate.Status().Queued == 1 && len(codes) == 5
	})
	close(u.gate)
	wg.Wait()
	close(codes)
	count := map[int]int{}
	for c := range codes {
		count[c]++
	}
	assert.Equal(t, map[int]int{200: 5, 429: 5}, count)
	// Which four the provider took first depends on arrival; the caps hold
	// whatever it was.
	assert.Equal(t, 4, u.get(u.peak, "all"), "provider cap, reached")
	assert.LessOrEqual(t, u.get(u.peak, "model:glm-5.3"), 2, "model cap")
	assert.LessOrEqual(t, u.get(u.peak, "org:org-a"), 2, "org-a's cap")
	assert.LessOrEqual(t, u.get(u.peak, "org:org-b"), 3, "the default org cap")
	assert.Positive(t, u.get(u.peak, "org:org-a"))
	waitFor(t, "all released", func() bool { return gw.tenants.Keys() == 0 && gw.gate.Status().InFlight == 0 })
}

func TestGatewayStreamsHoldSlotsUntilTheClientLeaves(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGateway(t, u)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := post(ctx, t, client, srv.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "data: {\"delta\":\"a\"}\n", line)

	dbg, err := client.Do(adminRequest(t, http.MethodGet, srv.URL+"/debug/slots", ""))
	require.NoError(t, err)
	var slotsSeen struct {
		Holders []struct {
			Key    string `json:"key"`
			SlotID uint64 `json:"slot_id"`
		} `json:"holders"`
	}
	require.NoError(t, json.NewDecoder(dbg.Body).Decode(&slotsSeen))
	dbg.Body.Close()
	require.Len(t, slotsSeen.Holders, 1, "/debug/slots lists the held slot")
	assert.Equal(t, "org-a/glm-5.3", slotsSeen.Holders[0].Key)
	assert.Equal(t, 1, gw.gate.Status().InFlight)

	cancel() // the client goes away mid-stream
	resp.Body.Close()
	waitFor(t, "both slots are freed", func() bool { return gw.tenants.Keys() == 0 && gw.gate.Status().InFlight == 0 })
	waitFor(t, "the upstream sees it", func() bool { return u.get(u.cur, "all") == 0 })
}

func TestGatewayAdminPatch(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGateway(t, u)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []*http.Response
	for range 2 {
		resp, err := post(ctx, t, client, srv.URL, "org-a", "glm-4")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		open = append(open, resp)
	}
	resp, err := post(ctx, t, client, srv.URL, "org-a", "glm-4")
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "org-a is at 2")
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	resp.Body.Close()

	patched, err := client.Do(adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", `{"limit":3}`))
	require.NoError(t, err)
	patched.Body.Close()
	require.Equal(t, http.StatusOK, patched.StatusCode)

	third, err := post(ctx, t, client, srv.URL, "org-a", "glm-4")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, third.StatusCode, "the new limit applies without a restart")
	cancel()
	for _, r := range append(open, third) {
		r.Body.Close()
	}
	waitFor(t, "all released", func() bool { return gw.tenants.Keys() == 0 && gw.gate.Status().InFlight == 0 })
}

func TestGatewayModelsTakeNoSlot(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGateway(t, u)
	resp, err := http.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), "glm-5.3")
	assert.Zero(t, gw.gate.Status().InFlight)
	// A listing has no model to read: a body it comes with is not looked at.
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/models", strings.NewReader("not JSON"))
	require.NoError(t, err)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

func TestGatewayUpstreamDown(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close() // nothing listens there now
	cfg, err := ParseConfig([]byte(fmt.Sprintf(testConfig, deadURL)))
	require.NoError(t, err)
	gw, err := New(cfg, &http.Transport{})
	require.NoError(t, err)
	defer gw.Close()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"glm-4"}`))
	gw.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusBadGateway, rec.Code)
	assert.JSONEq(t, `{"error":{"type":"api_error","message":"the upstream could not be reached","code":null}}`, rec.Body.String())
	assert.Zero(t, gw.tenants.Keys(), "the failed exchange frees its slots")
	assert.Zero(t, gw.gate.Status().InFlight)
}

// TestGatewayPatchReachesIdleKeys: a key used a moment ago and idle now gets
// the new limit too.
func TestGatewayPatchReachesIdleKeys(t *testing.T) {
	u := newUpstream(t)
	close(u.gate)
	srv, _ := startGateway(t, u)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	resp, err := post(context.Background(), t, client, srv.URL, "org-a", "glm-4")
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	patched, err := client.Do(adminRequest(t, http.MethodPatch, srv.URL+"/admin/orgs/org-a/concurrent-limit", `{"limit":0}`))
	require.NoError(t, err)
	patched.Body.Close()
	resp, err = post(context.Background(), t, client, srv.URL, "org-a", "glm-4")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "limit 0 applies at once, and is not retryable")
	assert.Contains(t, string(body), "disabled")
}

// TestGatewayRefusesUnaskedUpgrades: an upstream that switches protocols on
// a model request gets a 502, and the slots come back.
func TestGatewayRefusesUnaskedUpgrades(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
		brw.Flush()
	}))
	t.Cleanup(up.Close)
	cfg, err := ParseConfig([]byte(fmt.Sprintf(testConfig, up.URL)))
	require.NoError(t, err)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	gw, err := New(cfg, base)
	require.NoError(t, err)
	defer gw.Close()
	rec := httptest.NewRecorder()
	gw.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"glm-4"}`)))
	assert.Equal(t, http.StatusBadGateway, rec.Code)
	waitFor(t, "the grant comes back", func() bool { return gw.Provider().InFlight == 0 })
	assert.Zero(t, gw.TenantKeys())
	l := gw.Learned()
	assert.Equal(t, [len(l.ByKind)]uint64{pacing.Other: 1}, l.ByKind, "a refused upgrade is not an admission")
}

// Priorities through the gateway: the org "batch-jobs" is batch by config,
// with a minimum share of one of the provider's two slots. With both slots
// taken by batch and five more batch requests queued, an interactive
// request (X-Priority) from another org reaches the upstream next (batch
// still holds its minimum). A bad X-Priority is answered 400.
func TestGatewayPriorities(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 10, "priorities": {"batch-jobs": "batch"}, "weights": {"batch-jobs": 2}},
	"provider": {"max_concurrent_requests": 2, "shares": {"batch": {"min": 1}}}
}`)
	client := srv.Client()
	var wg sync.WaitGroup
	send := func(org, priority string) {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5.3","stream":true}`))
			req.Header.Set("X-Org-ID", org)
			if priority != "" {
				req.Header.Set("X-Priority", priority)
			}
			resp, err := client.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			assert.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		})
	}
	send("batch-jobs", "")
	waitFor(t, "the first batch request is upstream", func() bool { return u.get(u.cur, "all") == 1 })
	send("batch-jobs", "")
	waitFor(t, "the second batch request is upstream", func() bool { return u.get(u.cur, "all") == 2 })
	for i := 1; i <= 5; i++ {
		send("batch-jobs", "")
		waitFor(t, "batch requests queue", func() bool { return gw.Provider().Queued == i })
	}
	send("alice", "interactive")
	waitFor(t, "the interactive request queues", func() bool { return gw.Provider().Queued == 6 })
	q := gw.Provider().Queue
	assert.Equal(t, 5, q.Batch)
	assert.Equal(t, 1, q.Interactive)
	assert.Equal(t, "batch-jobs", q.TopFlows[0].Flow)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5.3"}`))
	req.Header.Set("X-Priority", "urgent")
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	u.gate <- struct{}{} // a batch stream ends
	waitFor(t, "the next request is upstream", func() bool { return len(u.arrived()) == 3 })
	assert.Equal(t, "alice", u.arrived()[2])
	close(u.gate)
	wg.Wait()
	waitFor(t, "every slot is released", func() bool { return gw.Provider().InFlight == 0 && gw.TenantKeys() == 0 })
	assert.Len(t, u.arrived(), 8)
}

func TestConfigPrioritiesAndWeights(t *testing.T) {
	for _, bad := range []string{
		`{"upstream":"http://x","orgs":{"priorities":{"a":"urgent"}}}`,
		`{"upstream":"http://x","orgs":{"priorities":{"a":""}}}`,
		`{"upstream":"http://x","orgs":{"weights":{"a":0}}}`,
		`{"upstream":"http://x","orgs":{"weights":{"a":1048577}}}`, // over slots.WithFlowWeight's bound
	} {
		_, err := ParseConfig([]byte(bad))
		assert.Error(t, err, bad)
	}
	_, err := ParseConfig([]byte(`{"upstream":"http://x","orgs":{"weights":{"a":1048576}}}`))
	assert.NoError(t, err, "the bound itself")
}

// fleetStores start, for a test, each store a fleet of gateways runs on,
// and return the "fleet" config's fields that point at it: Redis,
// PostgreSQL, and PostgreSQL through PgBouncer in transaction mode.
var fleetStores = map[string]func(t *testing.T) string{
	"redis":    func(t *testing.T) string { return `"redis_url": "redis://` + redistest.Start(t).Addr + `/0"` },
	"postgres": func(t *testing.T) string { return `"postgres_url": "` + pgtest.Start(t).URL + `"` },
	"pgbouncer": func(t *testing.T) string {
		srv := pgtest.Start(t)
		return `"postgres_url": "` + srv.Bouncer() + `", "postgres_listen_url": "` + srv.URL + `"`
	},
}

// Two gateways on one store (the fleet config: Redis or PostgreSQL): the
// provider cap of 2 and org-a's cap of 1 hold across both; every request
// completes.
func TestGatewayFleet(t *testing.T) {
	for name, store := range fleetStores {
		t.Run(name, func(t *testing.T) { testGatewayFleet(t, store(t)) })
	}
}

func testGatewayFleet(t *testing.T, store string) {
	u := newUpstream(t)
	format := `{
	"upstream": "%s",
	"orgs": {"default_limit": 10, "limits": {"org-a": 1}},
	"provider": {"max_concurrent_requests": 2, "models": {"glm-5.3": {"max_concurrent_requests": 2}}},
	"fleet": {` + store + `, "lease_ttl_ms": 3000}
}`
	gw1, g1 := startGatewayWith(t, u.srv.URL, format)
	gw2, g2 := startGatewayWith(t, u.srv.URL, format)
	client := gw1.Client()

	// org-a holds its one slot through gateway 1; gateway 2 refuses a second.
	resp, err := post(context.Background(), t, client, gw1.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	waitFor(t, "org-a's request is upstream", func() bool { return u.get(u.cur, "all") == 1 })
	refused, err := post(context.Background(), t, client, gw2.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	refused.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, refused.StatusCode, "org-a's cap holds across gateways")

	// Four more requests from other orgs, split over both gateways: the
	// provider cap of 2 holds across them.
	var wg sync.WaitGroup
	for i := range 4 {
		gw := []*httptest.Server{gw1, gw2}[i%2]
		wg.Go(func() {
			resp, err := post(context.Background(), t, client, gw.URL, fmt.Sprint("org-", i), "glm-5.3")
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		})
	}
	waitFor(t, "the provider cap is full", func() bool { return u.get(u.cur, "all") == 2 })
	waitFor(t, "three wait", func() bool { return g1.caps.Stats().Waiting+g2.caps.Stats().Waiting == 3 })
	close(u.gate)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	wg.Wait()
	assert.Equal(t, 2, u.get(u.peak, "all"), "never more than the provider cap across both gateways")
	waitFor(t, "everything released", func() bool {
		return g1.TenantKeys() == 0 && g2.TenantKeys() == 0 && g1.caps.Stats().Held == 0 && g2.caps.Stats().Held == 0
	})
}

// With a fleet, the provider's queue policy bounds the fleet's queue: a
// request over max_queue is refused at once, and one that waits past
// max_queue_wait_ms gives up its place, both with 429. The wait is long
// enough (2 s) that the waiter is still queued when the third request comes,
// however busy the machine: with 300 ms, a slow run saw the waiter give up
// first, and the third request queue and time out in its turn.
func TestGatewayFleetQueueBounds(t *testing.T) {
	srv := redistest.Start(t)
	u := newUpstream(t)
	gw, g := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"provider": {"max_concurrent_requests": 1, "max_queue": 1, "max_queue_wait_ms": 2000},
	"fleet": {"redis_url": "redis://`+srv.Addr+`/0"}
}`)
	client := gw.Client()
	held, err := post(context.Background(), t, client, gw.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	defer held.Body.Close()
	waitFor(t, "the first request is upstream", func() bool { return u.get(u.cur, "all") == 1 })
	waited := make(chan *http.Response, 1)
	go func() {
		resp, err := post(context.Background(), t, client, gw.URL, "org-b", "glm-5.3")
		if assert.NoError(t, err) {
			resp.Body.Close()
			waited <- resp
		}
	}()
	waitFor(t, "the second request waits in the fleet's queue", func() bool { return g.caps.Stats().Waiting == 1 })
	waitFor(t, "... in Redis", func() bool {
		n, err := srv.Client().ZCard(context.Background(), "inflight:{provider}:provider#q").Result()
		return err == nil && n == 1
	})
	bound, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound on a hang
	defer cancel()
	over, err := post(bound, t, client, gw.URL, "org-c", "glm-5.3")
	require.NoError(t, err, "refused at once, not queued")
	body, _ := io.ReadAll(over.Body)
	over.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, over.StatusCode, "over max_queue: %s", body)
	assert.Contains(t, string(body), "queue full")
	var resp *http.Response
	select {
	case resp = <-waited:
	case <-time.After(10 * time.Second): // a bound on a hang
		t.Fatal("the waiting request never gave up its place")
	}
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "past max_queue_wait_ms")
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	close(u.gate)
}

// "max_queue_per_flow": 0 lets none of an org's requests wait, as
// slots.WithMaxQueuePerFlow(0) does: with the provider full, an org's
// request is answered 429 queue_full at once, with and without a fleet,
// while the request that holds the slot streams on.
func TestGatewayPerFlowBoundZero(t *testing.T) {
	for _, fleet := range []bool{false, true} {
		t.Run(fmt.Sprintf("fleet %v", fleet), func(t *testing.T) {
			extra := ""
			if fleet {
				extra = `, "fleet": {"redis_url": "redis://` + redistest.Start(t).Addr + `/0"}`
			}
			u := newUpstream(t)
			defer close(u.gate)
			gw, _ := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"provider": {"max_concurrent_requests": 1, "max_queue_per_flow": 0, "max_queue_wait_ms": 5000}`+extra+`
}`)
			client := gw.Client()
			held, err := post(context.Background(), t, client, gw.URL, "org-a", "glm-5.3")
			require.NoError(t, err)
			defer held.Body.Close()
			require.Equal(t, http.StatusOK, held.StatusCode)
			waitFor(t, "the first request is upstream", func() bool { return u.get(u.cur, "all") == 1 })
			bound, cancel := context.WithTimeout(context.Background(), 4*time.Second) // less than the queue wait
			defer cancel()
			over, err := post(bound, t, client, gw.URL, "org-a", "glm-5.3")
			require.NoError(t, err, "refused at once, not queued")
			body, _ := io.ReadAll(over.Body)
			over.Body.Close()
			assert.Equal(t, http.StatusTooManyRequests, over.StatusCode, "%s", body)
			assert.Contains(t, string(body), "queue full")
			assert.Equal(t, 1, u.get(u.cur, "all"), "the first still streams")
		})
	}
}

func TestConfigFleet(t *testing.T) {
	for _, bad := range []string{
		`{"upstream":"http://x","fleet":{"redis_url":"http://x"}}`,
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","lease_ttl_ms":5}}`,
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","lease_ttl_ms":86400001}}`, // over fleet.MaxLeaseTTL: WithLeaseTTL would panic
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","on_unavailable":"maybe"}}`,
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","learned_format":3}}`,
	} {
		_, err := ParseConfig([]byte(bad))
		assert.Error(t, err, bad)
	}
	_, err := ParseConfig([]byte(`{"upstream":"http://x","fleet":{"redis_url":"redis://127.0.0.1:6379/0","on_unavailable":"closed"}}`))
	assert.NoError(t, err)
	for _, f := range []string{"1", "2"} {
		_, err = ParseConfig([]byte(`{"upstream":"http://x","fleet":{"redis_url":"redis://x","learned_format":` + f + `}}`))
		assert.NoError(t, err, "learned_format %s", f)
	}
	pg, err := ParseConfig([]byte(`{"upstream":"http://x","fleet":{"postgres_url":"postgres://gw@127.0.0.1:5432/gw"}}`))
	assert.NoError(t, err)
	// The store's calls time out after 2 s on PostgreSQL, 500 ms on Redis,
	// unless timeout_ms says otherwise.
	assert.Equal(t, 2*time.Second, pg.Fleet.timeout())
	rd, err := ParseConfig([]byte(`{"upstream":"http://x","fleet":{"redis_url":"redis://x","timeout_ms":750}}`))
	require.NoError(t, err)
	assert.Equal(t, 750*time.Millisecond, rd.Fleet.timeout())
	rd.Fleet.TimeoutMS = 0
	assert.Equal(t, 500*time.Millisecond, rd.Fleet.timeout())
	// At most a third of the lease TTL: the default is cut to it, a larger
	// timeout_ms refused.
	pg.Fleet.LeaseTTLMS = 3000
	assert.Equal(t, time.Second, pg.Fleet.timeout())
	for _, bad := range []string{
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","timeout_ms":-1}}`,
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","timeout_ms":10001}}`,
		`{"upstream":"http://x","fleet":{"postgres_url":"postgres://x/y","lease_ttl_ms":3000,"timeout_ms":1500}}`,
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","timeout_ms":9223372036854775807}}`,
		`{"upstream":"http://x","fleet":{}}`,
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","postgres_url":"postgres://x/y"}}`,
		`{"upstream":"http://x","fleet":{"postgres_url":"postgres://u:secret@x:notaport/y"}}`,
		`{"upstream":"http://x","fleet":{"postgres_url":"postgres://x/y","postgres_listen_url":"postgres://u:secret@x:notaport/y"}}`,
		`{"upstream":"http://x","fleet":{"redis_url":"redis://x","postgres_listen_url":"postgres://x/y"}}`,
	} {
		_, err := ParseConfig([]byte(bad))
		if assert.Error(t, err, bad) {
			assert.NotContains(t, err.Error(), "secret", "no password in the message")
		}
	}

	// Learned caps are the fleet's, but for a key pool's, which stay per
	// gateway: a key's cap learned from one gateway's count would be wrong.
	for _, adaptive := range []string{
		`"provider":{"adaptive":{}}`,
		`"provider":{"models":{"m":{"adaptive":{"max":8}}}}`,
	} {
		_, err := ParseConfig([]byte(`{"upstream":"http://x","fleet":{"redis_url":"redis://x"},` + adaptive + `}`))
		assert.NoError(t, err, adaptive)
	}
	_, err = ParseConfig([]byte(`{"upstream":"http://x","fleet":{"redis_url":"redis://x"},"provider":{"adaptive":{},"api_keys":[{"id":"a","max_concurrent_requests":2}]}}`))
	assert.ErrorContains(t, err, "api_keys")
}
