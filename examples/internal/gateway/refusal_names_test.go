package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// A request waiting for the provider when the gateway drains is answered
// 503 and, like every refusal, names a cap (header, error body, access
// line) and why: "provider", whose queue it waited in, and
// "shutting_down". It is counted once, there, as a wait cancelled.
func TestDrainRefusalNamesItsCap(t *testing.T) {
	u := newUpstream(t)
	log, logs := newTestLogger(slog.LevelInfo)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"provider": {"max_concurrent_requests": 1, "max_queue_wait_ms": 60000}
}`, WithLogger(log))
	client := srv.Client()
	var wg sync.WaitGroup
	done := make(chan struct{}, 1)
	streamAll(t, &wg, client, srv.URL, "glm-5.3", 1, done)
	waitFor(t, "the provider's slot is held", func() bool { return u.get(u.cur, "all") == 1 })

	type answer struct {
		resp *http.Response
		e    openAIError
	}
	got := make(chan answer, 1)
	go func() {
		resp, e := postBody(t, client, srv.URL, "org-q", `{"model":"glm-5.3","stream":true}`)
		got <- answer{resp, e}
	}()
	waitFor(t, "the second request waits", func() bool { return gw.Provider().Queued == 1 })
	gw.Drain()
	a := <-got
	require.Equal(t, http.StatusServiceUnavailable, a.resp.StatusCode)
	assert.Equal(t, "provider", a.resp.Header.Get(CapHeader))
	assert.Equal(t, "provider", a.e.Error.Cap)
	assert.Equal(t, "shutting_down", a.e.Error.Reason)
	assert.Equal(t, "the gateway is shutting down; retry the request", a.e.Error.Message)
	waitFor(t, "the refusal's access line", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `msg="gateway: request"`) && strings.Contains(line, "org=org-q") {
				return strings.Contains(line, "refused_by=provider")
			}
		}
		return false
	})

	text := scrape(t, client, srv.URL)
	assert.Contains(t, text, `inflight_rejected_total{cap="provider",reason="canceled"} 1`)
	assert.Contains(t, text, `inflight_rejected_total{cap="tenant",reason="canceled"} 0`, "not counted twice")

	u.gate <- struct{}{}
	wg.Wait()
	<-done
}

// A wait that runs out is told in the same words with a fleet as without
// one: the cap that refused is named in the message too, not only in the
// header.
func TestFleetWaitTimeoutWordedAsLocal(t *testing.T) {
	redisSrv := redistest.Start(t)
	for _, name := range []string{"local", "fleet"} {
		t.Run(name, func(t *testing.T) {
			for i, c := range []struct{ model, capName, message string }{
				{"glm-4", "provider", "too many requests in flight under the provider cap: 1 of 1, 0 queued (timed out waiting)"},
				{"glm-5.3", "model", "too many requests in flight under the model cap: 1 of 1, 0 queued (timed out waiting)"},
			} {
				u := newUpstream(t)
				limit := `"max_concurrent_requests": 2, "models": {"glm-5.3": {"max_concurrent_requests": 1}}`
				if c.capName == "provider" {
					limit = `"max_concurrent_requests": 1`
				}
				fleet := "" // a database of its own for each case: the keys' limits differ
				if name == "fleet" {
					fleet = fmt.Sprintf(`, "fleet": {"redis_url": "redis://%s/%d"}`, redisSrv.Addr, i)
				}
				srv, _ := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"provider": {`+limit+`, "max_queue_wait_ms": 50}`+fleet+`
}`)
				client := srv.Client()
				ctx, cancel := context.WithCancel(context.Background())
				held := make(chan struct{})
				go func() {
					defer close(held)
					resp, err := post(ctx, t, client, srv.URL, "org-a", c.model)
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
				waitFor(t, "the cap's slot is held", func() bool { return u.get(u.cur, "all") == 1 })
				resp, e := postBody(t, client, srv.URL, "org-b", `{"model":"`+c.model+`","stream":true}`)
				require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
				assert.Equal(t, c.capName, resp.Header.Get(CapHeader))
				assert.Equal(t, c.capName, e.Error.Cap)
				assert.Equal(t, "wait_timeout", e.Error.Reason)
				assert.Equal(t, c.message, e.Error.Message)
				cancel()
				<-held
			}
		})
	}
}
