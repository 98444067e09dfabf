package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	simulated "github.com/inflight-go/inflight/examples/internal/upstream"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
)

// hiddenUpstream serves a pacingtest.Upstream with a fixed hidden cap over
// loopback: a refusal takes 5 ms, an admitted answer's headers 20 ms.
func hiddenUpstream(t *testing.T, schedule ...pacingtest.Step) (*simulated.Hidden, *httptest.Server) {
	u := &pacingtest.Upstream{Schedule: schedule, RefusalDelay: 5 * time.Millisecond, HeaderDelay: 20 * time.Millisecond}
	u.Start()
	h := simulated.NewHidden(u)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return h, srv
}

// answer is what a client got: the status and the whole body.
type answer struct {
	status int
	body   string
}

// ask sends one chat completion that streams for service, and reads the
// answer to its end.
func ask(ctx context.Context, client *http.Client, url string, service time.Duration) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set(pacingtest.ServiceHeader, service.String())
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(body)}, err
}

// learnsTheCap drives a gateway that learns an upstream's hidden cap of
// hidden: three times the cap in clients, each asking again as soon as it
// has its answer, so that the demand is always over the cap. send sends
// one request that streams for service and returns its status; sent
// counts what the gateway sends to the upstream. poll waits for a
// condition (by polling). When score is set (in virtual time), it samples
// the learned cap for 1.5 s once learned and asserts how well it holds;
// otherwise it asserts what holds on any machine and logs the figures.
func learnsTheCap(t *testing.T, gw *Gateway, hidden int, u *pacingtest.Upstream, sent interface {
	Peak() int
	ResetPeak()
}, send func(ctx context.Context, service time.Duration) int, score bool) {
	ctx, stop := context.WithCancel(context.Background())
	var (
		wg                sync.WaitGroup
		counting          atomic.Bool
		answered, refused atomic.Int64
		other             atomic.Int64
	)
	for range 3 * hidden {
		wg.Go(func() {
			for ctx.Err() == nil {
				status := send(ctx, 100*time.Millisecond)
				if ctx.Err() != nil || !counting.Load() {
					continue
				}
				answered.Add(1)
				switch status {
				case http.StatusOK:
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	defer func() {
		stop()
		wg.Wait()
	}()

	within := func(n int) bool { return n >= hidden-1 && n <= hidden+1 }
	// Learned: the cap is within one, and no wider batch of probes is out.
	// (The upstream never has more open than the gateway has in flight: it
	// ends a request before the gateway can see its end.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := gw.Learned()
		if within(l.Cap) && l.Limit <= l.Cap+1 && gw.Provider().InFlight <= l.Cap+1 {
			break
		}
		require.False(t, time.Now().After(deadline), "the learned cap reaches the hidden one within 10 s")
		time.Sleep(time.Millisecond) // polling a condition
	}
	// From here on, three retests' worth of answers, the learned cap sampled
	// as they come.
	sent.ResetPeak()
	counting.Store(true)
	before := u.Counts()
	maxCap, samples, off := 0, 0, 0
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); <-tick.C {
		c := gw.Learned().Cap
		samples++
		if !within(c) {
			off++
		}
		maxCap = max(maxCap, c)
	}
	counting.Store(false)
	after := u.Counts()
	attempts, refusedUp := after.Attempts-before.Attempts, after.Refused-before.Refused
	require.Positive(t, attempts)
	t.Logf("after learning: the cap off by more than one in %d of %d samples, at most %d; at most %d open at the upstream; "+
		"%d attempts, %d answered 429 (%.1f%%); %d answers to clients, %d of them 429",
		off, samples, maxCap, sent.Peak(), attempts, refusedUp, 100*float64(refusedUp)/float64(attempts), answered.Load(), refused.Load())
	assert.Zero(t, other.Load(), "every answer is a 200 or a 429")
	l := gw.Learned()
	assert.True(t, l.Enabled)
	assert.Positive(t, l.ByKind[pacing.Admitted])
	assert.Positive(t, l.ByKind[pacing.Concurrency], "the cap was found by the upstream's refusals")
	if !score {
		return
	}
	// The upstream ends a request a moment before the gateway sees its
	// end, so now and then a probe finds room that is not there: the
	// learned cap can go one over (a retest admitted so only reopens the
	// ceiling, but the probe of the climb that follows, admitted so too,
	// raises the cap), and the first refusal at a count once admitted
	// takes it one below that count.
	assert.LessOrEqual(t, maxCap, hidden+1, "the learned cap never goes more than one over")
	assert.GreaterOrEqual(t, samples-off, samples*8/10, "the learned cap stays within one of %d nearly all the time", hidden)
	// A retest sends one probe over the cap; a batch of probes, when the
	// ceiling is unknown again, is at most 4 wide.
	assert.LessOrEqual(t, sent.Peak(), maxCap+4, "open at the upstream, by its own count: the learned cap and its probes at most")
	// Each retest costs a 429, and some 120 requests are answered here.
	assert.LessOrEqual(t, float64(refusedUp)/float64(attempts), 0.10, "429s are a small share")
}

// learningConfig is a gateway that learns the provider's cap from 2, and
// retests its ceiling every 500 ms.
const learningConfig = `{"upstream": "%s", "provider": {"adaptive": {"initial": 2, "retest_ms": 500}, "max_queue": 100}}`

// TestGatewayLearnsTheUpstreamsCap: with "adaptive" and no
// max_concurrent_requests, a gateway under more load than an upstream's
// hidden cap of 8 learns the cap from the upstream's answers, to within one,
// and keeps it: once learned, the upstream (counting for itself every
// request open at it, the refused ones too) never sees more than the cap
// plus the probes a retest sends, and only a small share of the requests
// is refused. In virtual time, the gateway called in process, its
// upstream a RoundTripper; TestGatewayLearnsOverSockets plays the same
// over loopback on a real clock.
func TestGatewayLearnsTheUpstreamsCap(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		const hidden = 8
		u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{Cap: hidden}}, RefusalDelay: 5 * time.Millisecond, HeaderDelay: 20 * time.Millisecond}
		u.Start()
		sent := &counting{base: u}
		cfg, err := ParseConfig([]byte(fmt.Sprintf(learningConfig, "http://upstream.invalid")))
		require.NoError(t, err)
		gw, err := New(cfg, sent, quiet)
		require.NoError(t, err)
		defer gw.Close()
		learnsTheCap(t, gw, hidden, u, sent, func(ctx context.Context, service time.Duration) int {
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"glm-5","stream":true}`))
			req.Header.Set(pacingtest.ServiceHeader, service.String())
			rec := httptest.NewRecorder()
			gw.ServeHTTP(rec, req)
			return rec.Code
		}, true)
	})
}

// TestGatewayLearnsOverSockets is TestGatewayLearnsTheUpstreamsCap over
// loopback sockets, on a real clock: the cap is learned within 10 s and
// found by refusals, every answer is a 200 or a 429; how well the cap
// holds once learned is logged (a busy machine moves it).
func TestGatewayLearnsOverSockets(t *testing.T) {
	const hidden = 8
	up, upSrv := hiddenUpstream(t, pacingtest.Step{Cap: hidden})
	srv, gw := startGatewayWith(t, upSrv.URL, learningConfig, quiet)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
	learnsTheCap(t, gw, hidden, up.U, up, func(ctx context.Context, service time.Duration) int {
		a, err := ask(ctx, client, srv.URL, service)
		if err != nil {
			return 0
		}
		return a.status
	}, false)
}

// counting is a RoundTripper that counts the requests open at its base, as
// simulated.Hidden counts them over HTTP: from the call until the answer's
// body is closed or read to its end (refused requests too).
type counting struct {
	base       http.RoundTripper
	open, peak atomic.Int64
}

func (c *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	n := c.open.Add(1)
	for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
	}
	resp, err := c.base.RoundTrip(req)
	if err != nil {
		c.open.Add(-1)
		return nil, err
	}
	resp.Body = &countedBody{ReadCloser: resp.Body, done: func() { c.open.Add(-1) }}
	return resp, nil
}

func (c *counting) Peak() int  { return int(c.peak.Load()) }
func (c *counting) ResetPeak() { c.peak.Store(c.open.Load()) }

// countedBody calls done once, at its end or Close.
type countedBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(b.done)
	}
	return n, err
}

func (b *countedBody) Close() error {
	b.once.Do(b.done)
	return b.ReadCloser.Close()
}

// TestGatewayRelaysTheWholeErrorBody: the gateway reads the first bytes of
// an error answer to classify it, and the client still gets the upstream's
// answer as it was, byte for byte, however long its body.
func TestGatewayRelaysTheWholeErrorBody(t *testing.T) {
	long := `{"error":{"code":"1302","message":"Rate limit reached for requests","detail":"` + strings.Repeat("x", 3*pacing.MaxClassifyBody) + `"}}`
	for _, tc := range []struct {
		name   string
		status int
		body   string
		kind   pacing.Kind
	}{
		{"a 429 longer than what is classified", http.StatusTooManyRequests, long, pacing.Concurrency},
		{"a short 429", http.StatusTooManyRequests, `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`, pacing.Concurrency},
		{"a 500 that is not JSON", http.StatusInternalServerError, strings.Repeat("upstream trouble\n", 1000), pacing.Other},
		{"a 503", http.StatusServiceUnavailable, `{"error":{"message":"overloaded"}}`, pacing.Overload},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			t.Cleanup(up.Close)
			srv, gw := startGatewayWith(t, up.URL, `{"upstream": "%s", "provider": {"adaptive": {}}}`)
			a, err := ask(context.Background(), srv.Client(), srv.URL, 0)
			require.NoError(t, err)
			assert.Equal(t, tc.status, a.status)
			assert.Equal(t, tc.body, a.body, "the body as the upstream sent it")
			// Reported as the proxy reads the body's end, which may come
			// just after the client has all of it.
			waitFor(t, fmt.Sprint("the answer is reported as ", tc.kind), func() bool { return gw.Learned().ByKind[tc.kind] == 1 })
			waitFor(t, "the slots come back", func() bool { return gw.Provider().InFlight == 0 && gw.TenantKeys() == 0 })
		})
	}
}

// TestGatewayPassesASlowErrorBodyOn: an error answer whose body stays open
// (an upstream that streams why it refused) reaches the client as it
// comes; the answer is classified from what has passed by the time the
// body ends, before its slot is freed.
func TestGatewayPassesASlowErrorBodyOn(t *testing.T) {
	release := make(chan struct{})
	const event = `data: {"error":{"code":"1302","message":"Rate limit reached for requests"}}` + "\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, event)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	srv, gw := startGatewayWith(t, up.URL, `{"upstream": "%s", "provider": {"adaptive": {}}}`)
	// Bounded: a gateway that waits for the body's end fails here instead
	// of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := post(ctx, t, srv.Client(), srv.URL, "org-a", "glm-5")
	require.NoError(t, err, "the status comes while the body is still open")
	defer resp.Body.Close()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, event, line)
	assert.Equal(t, 1, gw.Provider().InFlight, "the answer still holds its slot")
	assert.Zero(t, gw.Learned().ByKind[pacing.Concurrency], "not decided while the body is open")

	close(release)
	_, err = io.ReadAll(r)
	require.NoError(t, err)
	waitFor(t, "the 429 is reported", func() bool { return gw.Learned().ByKind[pacing.Concurrency] == 1 })
	waitFor(t, "the slot comes back", func() bool { return gw.Provider().InFlight == 0 })
}

// TestGatewayReportsEachGrantOnce: every request that reaches the upstream
// with a provider grant is reported once, a failed exchange as no evidence
// (Other); a request let through without a slot after its wait
// (on_wait_timeout "proceed") and a model listing report nothing.
func TestGatewayReportsEachGrantOnce(t *testing.T) {
	u := newUpstream(t)
	srv, gw := startGatewayWith(t, u.srv.URL, `{"upstream": "%s", "orgs": {"default_limit": 10},
		"provider": {"adaptive": {"initial": 1, "max": 1}, "max_queue_wait_ms": 50, "on_wait_timeout": "proceed"}}`)
	client := srv.Client()

	// The first holds the one slot; the second waits 50 ms and goes
	// without one.
	first, err := post(context.Background(), t, client, srv.URL, "org-a", "glm-5")
	require.NoError(t, err)
	defer first.Body.Close()
	second, err := post(context.Background(), t, client, srv.URL, "org-a", "glm-5")
	require.NoError(t, err)
	defer second.Body.Close()
	assert.Equal(t, http.StatusOK, second.StatusCode)
	assert.Equal(t, uint64(1), gw.Provider().Bypassed)
	models, err := client.Get(srv.URL + "/v1/models")
	require.NoError(t, err)
	io.Copy(io.Discard, models.Body)
	models.Body.Close()
	close(u.gate)
	for _, resp := range []*http.Response{first, second} {
		_, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
	}
	l := gw.Learned()
	assert.Equal(t, [len(l.ByKind)]uint64{pacing.Admitted: 1}, l.ByKind, "the granted request alone is reported")

	// An upstream that drops the connection: a failed exchange.
	dropping := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	t.Cleanup(dropping.Close)
	srv, gw = startGatewayWith(t, dropping.URL, `{"upstream": "%s", "provider": {"adaptive": {}}}`)
	a, err := ask(context.Background(), srv.Client(), srv.URL, 0)
	require.NoError(t, err)
	assert.Equal(t, http.StatusBadGateway, a.status)
	l = gw.Learned()
	assert.Equal(t, [len(l.ByKind)]uint64{pacing.Other: 1}, l.ByKind, "a failed exchange is reported, as no evidence")
	waitFor(t, "the slot comes back (after the linger of a cut)", func() bool { return gw.Provider().InFlight == 0 })
}

// TestConfigAdaptive: max_concurrent_requests may be left out where an
// adaptive section learns the cap, for the provider and for a model, and a
// model's section learns that model's cap; a bad section names its field.
func TestConfigAdaptive(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"upstream": "http://127.0.0.1:1",
		"provider": {"adaptive": {"min": 2, "max": 40, "initial": 6, "retest_ms": 5000},
			"models": {"glm-5": {"adaptive": {}}, "glm-4-air": {"max_concurrent_requests": 3}}}}`))
	require.NoError(t, err)
	assert.Zero(t, cfg.Provider.MaxConcurrentRequests)
	gw, err := New(cfg, http.DefaultTransport)
	require.NoError(t, err)
	defer gw.Close()
	l := gw.Learned()
	assert.True(t, l.Enabled)
	assert.Equal(t, 6, l.Cap, "learning starts at initial")
	assert.Equal(t, 40, l.Ceiling, "under max")
	require.Contains(t, l.Models, "glm-5")
	assert.Equal(t, pacing.DefaultAdaptiveInitial, l.Models["glm-5"].Cap)
	assert.NotContains(t, l.Models, "glm-4-air", "a model without a section has its configured cap")
	rec := httptest.NewRecorder()
	gw.debugProvider(rec, httptest.NewRequest(http.MethodGet, "/debug/provider", nil))
	assert.Contains(t, rec.Body.String(), `"learned_models":{"glm-5":{"limit":5,"cap":4,"ceiling":1024,"floor":1,"max":1024,"changes":1}}`,
		"/debug/provider shows the model's learned cap, and only that model's")

	for _, tc := range []struct{ config, field string }{
		{`{"adaptive": {"min": 5, "max": 3}}`, "provider: pacing: adaptive.min"},
		{`{"adaptive": {"initial": -1}}`, "provider: pacing: adaptive.initial"},
		{`{"models": {"glm-5": {"adaptive": {"min": 4}, "max_concurrent_requests": 2}}}`, `provider: pacing: models["glm-5"].adaptive.min`},
		{`{"adaptive": {"step": 2}}`, `unknown field "step"`},
	} {
		_, err := ParseConfig([]byte(`{"upstream": "http://127.0.0.1:1", "provider": ` + tc.config + `}`))
		assert.ErrorContains(t, err, tc.field, tc.config)
	}
}
