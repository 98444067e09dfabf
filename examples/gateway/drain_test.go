package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// waitMetric scrapes addr's /metrics until it has the line want.
func waitMetric(t *testing.T, client *http.Client, addr, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := get(t, client, "http://"+addr+"/metrics", "")
		if strings.Contains(body, want+"\n") {
			return
		}
		require.False(t, time.Now().After(deadline), "no %q in /metrics within 10 s", want)
		runtime.Gosched()
	}
}

// A request waiting for the provider at SIGTERM is answered 503 at once,
// so that its client retries elsewhere, while the stream already upstream
// goes on to its end.
func TestDrainTurnsAwayTheProviderQueue(t *testing.T) {
	up, release := streamingUpstream(t)
	p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"`+up.URL+`",
		"provider":{"max_concurrent_requests":1},"shutdown_timeout_ms":20000}`)
	_, stream := openStream(t, p.addr)

	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	queued := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
		resp, err := client.Do(req)
		if !assert.NoError(t, err) {
			close(queued)
			return
		}
		queued <- resp
	}()
	waitMetric(t, client, p.addr, `inflight_waiting{cap="provider"} 1`)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	resp, ok := <-queued // before the stream in flight is let go
	require.True(t, ok)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Equal(t, "1000", resp.Header.Get(slots.HeaderRetryAfterMs), "the clients that read retry-after-ms first")
	assert.True(t, resp.Close, "Connection: close")
	assert.Equal(t, "provider", resp.Header.Get("X-Inflight-Cap"), "the cap it waited for")
	var e struct {
		Error struct{ Message, Type, Cap, Reason string }
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	assert.Equal(t, "overloaded_error", e.Error.Type)
	assert.Equal(t, "provider", e.Error.Cap)
	assert.Equal(t, "shutting_down", e.Error.Reason)
	assert.Equal(t, "the gateway is shutting down; retry the request", e.Error.Message)

	close(release)
	rest, err := io.ReadAll(stream)
	require.NoError(t, err)
	assert.Equal(t, "\ndata: last\n\ndata: [DONE]\n\n", string(rest), "the stream completes with its last event")
	assert.Equal(t, 0, p.exitCode(t))
}

// With admin.listen, the admin address stops accepting as the drain
// starts, as the model API's does, not once the model API has drained.
func TestDrainClosesTheAdminListenerToo(t *testing.T) {
	t.Setenv("GATEWAY_TEST_ADMIN_TOKEN", "drain-admin-token-0123456789")
	up, release := streamingUpstream(t)
	p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"`+up.URL+`","shutdown_timeout_ms":20000,
		"admin":{"token_env":"GATEWAY_TEST_ADMIN_TOKEN","listen":"127.0.0.1:0"}}`)
	m := regexp.MustCompile(`admin_addr=(\S+)`).FindStringSubmatch(p.logged())
	require.NotNil(t, m, "the listening line names the admin address:\n%s", p.logged())
	_, stream := openStream(t, p.addr)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.waitLine(t, `msg="gateway: draining"`)
	for _, addr := range []string{p.addr, m[1]} {
		_, err := net.DialTimeout("tcp", addr, time.Second)
		assert.Error(t, err, "no new connections to %s while draining", addr)
	}
	close(release)
	_, err := io.ReadAll(stream)
	require.NoError(t, err)
	assert.Equal(t, 0, p.exitCode(t))
}

// redisLeases lists the keys of rdb that hold leases (sorted sets).
func redisLeases(t *testing.T, rdb *redis.Client) []string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	var held []string
	for _, k := range keys {
		if typ, err := rdb.Type(ctx, k).Result(); err == nil && typ == "zset" {
			held = append(held, k)
		}
	}
	return held
}

// A drain cut short lets the cut requests release their fleet leases
// before the gateway closes: none is left in Redis to expire a lease TTL
// later.
func TestCutDrainLeavesNoLeaseInRedis(t *testing.T) {
	redisSrv := redistest.Start(t)
	up, release := streamingUpstream(t)
	defer close(release)
	p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"`+up.URL+`",
		"provider":{"max_concurrent_requests":2},
		"fleet":{"redis_url":"redis://`+redisSrv.Addr+`/0","lease_ttl_ms":60000}}`)
	rdb := redisSrv.Client()
	t.Cleanup(func() { rdb.Close() })
	leases := func() []string { return redisLeases(t, rdb) }
	_, stream := openStream(t, p.addr)
	require.NotEmpty(t, leases(), "the stream holds leases")

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.waitLine(t, `msg="gateway: draining"`)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	assert.Equal(t, 1, p.exitCode(t))
	assert.Contains(t, p.logged(), `msg="gateway: drain cut short" drained=0 cut=1`)
	_, _ = io.ReadAll(stream)
	assert.Empty(t, leases(), "no lease left behind")
}

// A stream cut by its client during a drain keeps its provider slot for
// cut_linger_ms after its handler has returned: a drain that completes
// meanwhile lets it go before the gateway closes, so that its lease is not
// left in Redis to expire a lease TTL later, holding a slot of the fleet's
// for nobody; a drain whose bound passes first says it was cut short.
func TestDrainLeavesNoLingeringLeaseInRedis(t *testing.T) {
	for _, tc := range []struct {
		name, timings string
		exit          int
	}{
		{"the linger ends within the drain's bound", `"cut_linger_ms":1000,"shutdown_timeout_ms":20000`, 0},
		{"the drain's bound ends first", `"cut_linger_ms":30000,"shutdown_timeout_ms":500`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redisSrv := redistest.Start(t)
			up, release := streamingUpstream(t)
			defer close(release)
			p := startProcess(t, `{"listen":"127.0.0.1:0","upstream":"`+up.URL+`",
				"provider":{"max_concurrent_requests":2},`+tc.timings+`,
				"fleet":{"redis_url":"redis://`+redisSrv.Addr+`/0","lease_ttl_ms":60000}}`)
			rdb := redisSrv.Client()
			t.Cleanup(func() { rdb.Close() })
			resp, _ := openStream(t, p.addr)
			require.NotEmpty(t, redisLeases(t, rdb), "the stream holds leases")

			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
			p.waitLine(t, `msg="gateway: draining"`)
			resp.Body.Close() // the client walks away: its handler returns, its provider slot lingers
			require.Equal(t, tc.exit, p.exitCode(t))
			if tc.exit == 0 {
				assert.Empty(t, redisLeases(t, rdb), "no lease left behind")
				return
			}
			assert.Contains(t, p.logged(), `msg="gateway: drain cut short" drained=1 cut=0`)
			assert.Contains(t, p.logged(), "released=false")
		})
	}
}
