package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// limitedUpstream streams SSE chat completions and, like a provider with a
// concurrency-limited plan, answers 429 past its own limit. It counts a
// request as in flight from the moment its handler starts until the handler
// has returned: what the provider itself sees, not what the gateway
// believes. Like many streaming servers it notices a client that went away
// when it is about to send its next event, one interval after the cut at
// most.
type limitedUpstream struct {
	srv      *httptest.Server
	limit    int64
	events   int
	every    time.Duration
	inFlight atomic.Int64
	peak     atomic.Int64
	refused  atomic.Int64
	served   atomic.Int64
}

func newLimitedUpstream(t *testing.T, limit int64) *limitedUpstream {
	u := &limitedUpstream{limit: limit, events: 20, every: 2 * time.Millisecond}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *limitedUpstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n := u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	for pk := u.peak.Load(); n > pk && !u.peak.CompareAndSwap(pk, n); pk = u.peak.Load() {
	}
	if n > u.limit {
		u.refused.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`)
		return
	}
	u.served.Add(1)
	w.Header().Set("Content-Type", "text/event-stream")
	tick := time.NewTicker(u.every)
	defer tick.Stop()
	for i := range u.events {
		if r.Context().Err() != nil {
			return
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"%d\"}}]}\n\n", i)
		w.(http.Flusher).Flush()
		<-tick.C
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestGatewayClientsWalkingAwayMidStream: clients that go away at random
// points of their streams never make the upstream see more requests than
// the provider cap, set to the upstream's own limit, so the upstream never
// answers 429. The count is the upstream's own, and the gateway runs with
// its default settings.
func TestGatewayClientsWalkingAwayMidStream(t *testing.T) {
	const limit, workers, perWorker = 4, 8, 6
	u := newLimitedUpstream(t, limit)
	srv, gw := startGatewayWith(t, u.srv.URL, `{
	"upstream": "%s",
	"orgs": {"default_limit": 64},
	"provider": {"max_concurrent_requests": 4}
}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)

	var cut, completed atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		rng := rand.New(rand.NewPCG(uint64(w), 14))
		wg.Go(func() {
			for range perWorker {
				walkAway := rng.IntN(3) != 0 // two in three walk away
				after := rng.IntN(u.events)  // having read this many events
				ctx, cancel := context.WithCancel(context.Background())
				resp, err := post(ctx, t, client, srv.URL, fmt.Sprint("org-", w), "glm-5.3")
				if !assert.NoError(t, err) {
					cancel()
					return
				}
				br := bufio.NewReader(resp.Body)
				events := 0
				for !walkAway || events <= after {
					line, err := br.ReadString('\n')
					if err != nil {
						break
					}
					if strings.HasPrefix(line, "data: {") {
						events++
					}
				}
				cancel()
				resp.Body.Close()
				if walkAway {
					cut.Add(1)
				} else {
					completed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, "the gateway holds nothing", func() bool { return gw.Provider().InFlight == 0 && gw.TenantKeys() == 0 })
	t.Logf("%d streams cut, %d read to the end; the upstream: peak %d in flight, %d served, %d refused",
		cut.Load(), completed.Load(), u.peak.Load(), u.served.Load(), u.refused.Load())
	require.Positive(t, cut.Load())
	assert.Zero(t, u.refused.Load(), "the upstream's 429s")
	assert.LessOrEqual(t, u.peak.Load(), int64(limit), "the upstream's own peak in flight")
}

func TestConfigCutLinger(t *testing.T) {
	for _, tc := range []struct {
		json string
		want time.Duration
	}{
		{`{"upstream":"http://x"}`, DefaultCutLingerMS * time.Millisecond},
		{`{"upstream":"http://x","cut_linger_ms":40}`, 40 * time.Millisecond},
		{`{"upstream":"http://x","cut_linger_ms":-1}`, 0},
	} {
		cfg, err := ParseConfig([]byte(tc.json))
		require.NoError(t, err, tc.json)
		assert.Equal(t, tc.want, cfg.cutLinger(), tc.json)
	}
	_, err := ParseConfig([]byte(`{"upstream":"http://x","cut_linger_ms":60001}`))
	assert.ErrorContains(t, err, "cut_linger_ms")
	assert.Equal(t, DefaultCutLingerMS*time.Millisecond, Config{}.cutLinger(), "a Config built in code gets the default too")
	assert.Equal(t, time.Duration(math.MaxInt64), Config{CutLingerMS: math.MaxInt64}.cutLinger(), "no overflow")
}
