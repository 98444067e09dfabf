package slots_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// upstream is a gated model server: it counts the requests it is serving,
// holds each until the gate opens, then answers as JSON or as an SSE stream.
type upstream struct {
	srv        *httptest.Server
	cur, peak  atomic.Int64
	arrived    chan struct{}
	gate       chan struct{}
	events     int           // SSE events per streamed answer
	eventGate  chan struct{} // when not nil, each SSE event waits for it
	disconnect chan struct{} // signalled when a client goes away mid-stream
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{arrived: make(chan struct{}, 64), gate: make(chan struct{}), events: 3, disconnect: make(chan struct{}, 64)}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	n := u.cur.Add(1)
	defer u.cur.Add(-1) // the answer is complete: the upstream is done with it
	for {
		pk := u.peak.Load()
		if n <= pk || u.peak.CompareAndSwap(pk, n) {
			break
		}
	}
	u.arrived <- struct{}{}
	select {
	case <-u.gate:
	case <-r.Context().Done():
		u.disconnect <- struct{}{}
		return
	}
	if r.URL.Query().Get("stream") != "1" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"message":{"content":"hi"}}]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range u.events {
		if u.eventGate != nil {
			select {
			case <-u.eventGate:
			case <-r.Context().Done():
				u.disconnect <- struct{}{}
				return
			}
		}
		fmt.Fprintf(w, "data: {\"delta\":%d}\n\n", i)
		w.(http.Flusher).Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// proxyTo returns a gateway: a ReverseProxy to u whose transport holds a slot
// of lim per upstream request.
func proxyTo(t *testing.T, u *upstream, lim *slots.Limiter) (*httptest.Server, *http.Transport) {
	return proxyToURL(t, u.srv.URL, lim)
}

// proxyToURL is proxyTo for any upstream server.
func proxyToURL(t *testing.T, upstreamURL string, lim *slots.Limiter) (*httptest.Server, *http.Transport) {
	target, err := url.Parse(upstreamURL)
	require.NoError(t, err)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	gw := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }),
	})
	t.Cleanup(gw.Close)
	return gw, base
}

func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// waitFor spins until cond holds, yielding the processor; it fails the test
// after a generous bound instead of hanging.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
	}
}

func TestTransportUpstreamProbe(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int
		stream bool
	}{
		{"limit 2, JSON answers", 2, false},
		{"limit 2, SSE streams", 2, true},
		{"unlimited, SSE streams", slots.Unlimited, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUpstream(t)
			lim := slots.NewLimiter(tc.limit)
			gw, _ := proxyTo(t, u, lim)
			client := newClient(t)
			want := min(tc.limit, 5)

			var wg sync.WaitGroup
			codes := make(chan int, 5)
			bodies := make(chan string, 5)
			for range 5 {
				wg.Go(func() {
					q := ""
					if tc.stream {
						q = "?stream=1"
					}
					resp, err := client.Post(gw.URL+"/v1/chat/completions"+q, "application/json", strings.NewReader(`{"model":"glm-5"}`))
					if !assert.NoError(t, err) {
						return
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					assert.NoError(t, err)
					codes <- resp.StatusCode
					bodies <- string(b)
				})
			}
			for range want {
				<-u.arrived
			}
			waitFor(t, "the rest queue", func() bool { return lim.Waiting() == 5-want })
			assert.Equal(t, int64(want), u.cur.Load(), "exactly the limit reaches the upstream")
			assert.Equal(t, want, lim.InFlight())
			close(u.gate)
			wg.Wait()
			close(codes)
			close(bodies)
			for c := range codes {
				assert.Equal(t, http.StatusOK, c)
			}
			for b := range bodies {
				if tc.stream {
					assert.True(t, strings.HasSuffix(b, "data: [DONE]\n\n"), "the whole stream arrives: %q", b)
				} else {
					assert.Contains(t, b, `"content":"hi"`)
				}
			}
			assert.Equal(t, int64(want), u.peak.Load())
			waitFor(t, "every slot is released", func() bool { return lim.InFlight() == 0 })
			assert.Equal(t, 0, lim.Waiting())
		})
	}
}

func TestTransportHoldsTheSlotForTheWholeStream(t *testing.T) {
	setup := func(t *testing.T) (*upstream, *slots.Limiter, *http.Client) {
		u := newUpstream(t)
		u.eventGate = make(chan struct{})
		close(u.gate)
		lim := slots.NewLimiter(1)
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		admit := func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }
		return u, lim, &http.Client{Transport: slots.NewTransport(base, admit)}
	}
	// open starts a streamed request, lets its first event through and
	// returns the response with the first event read.
	open := func(t *testing.T, ctx context.Context, u *upstream, client *http.Client) (*http.Response, *bufio.Reader) {
		type result struct {
			resp *http.Response
			err  error
		}
		got := make(chan result, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.srv.URL+"/v1/chat/completions?stream=1", nil)
			resp, err := client.Do(req)
			got <- result{resp, err}
		}()
		<-u.arrived
		u.eventGate <- struct{}{} // the first event flushes the headers
		r := <-got
		require.NoError(t, r.err)
		br := bufio.NewReader(r.resp.Body)
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "data: {\"delta\":0}\n", line)
		return r.resp, br
	}
	// queueSecond starts a request that must wait for the first one's slot.
	queueSecond := func(t *testing.T, lim *slots.Limiter, u *upstream, client *http.Client) chan error {
		done := make(chan error, 1)
		go func() {
			resp, err := client.Get(u.srv.URL + "/v1/chat/completions?stream=1")
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			done <- err
		}()
		waitFor(t, "the second request queues", func() bool { return lim.Waiting() == 1 })
		return done
	}
	finishSecond := func(t *testing.T, u *upstream, done chan error) {
		<-u.arrived
		for range u.events {
			u.eventGate <- struct{}{}
		}
		assert.NoError(t, <-done)
	}

	t.Run("held after the headers, freed once the client has read it all", func(t *testing.T) {
		u, lim, client := setup(t)
		resp, br := open(t, context.Background(), u, client)
		assert.Equal(t, 1, lim.InFlight(), "RoundTrip has returned; the stream still holds its slot")
		done := queueSecond(t, lim, u, client)
		for range u.events - 1 {
			u.eventGate <- struct{}{}
		}
		rest, err := io.ReadAll(br)
		require.NoError(t, err)
		assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"))
		finishSecond(t, u, done) // admitted only now
		resp.Body.Close()
		waitFor(t, "all released", func() bool { return lim.InFlight() == 0 })
	})

	t.Run("a client that goes away midway frees the slot and the upstream sees it", func(t *testing.T) {
		u, lim, client := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		resp, _ := open(t, ctx, u, client)
		done := queueSecond(t, lim, u, client)
		cancel() // nobody reads or closes the body: the context's end is enough
		<-u.disconnect
		finishSecond(t, u, done)
		resp.Body.Close()
		waitFor(t, "all released", func() bool { return lim.InFlight() == 0 })
		assert.Equal(t, uint64(0), lim.Stats().DoubleReleases, "several ends of one stream are not misuse")
	})
}

func TestTransportUpstreamFailures(t *testing.T) {
	t.Run("an upstream that drops the connection before answering", func(t *testing.T) {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}))
		t.Cleanup(up.Close)
		lim := slots.NewLimiter(1)
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })}
		_, err := client.Get(up.URL)
		require.Error(t, err)
		assert.Equal(t, 0, lim.InFlight(), "a failed round trip frees its slot")
	})
	t.Run("an upstream 429 passes through the proxy unchanged and frees the slot", func(t *testing.T) {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`)
		}))
		t.Cleanup(up.Close)
		lim := slots.NewLimiter(1)
		gw, _ := proxyToURL(t, up.URL, lim)
		resp, err := newClient(t).Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "7", resp.Header.Get("Retry-After"))
		assert.JSONEq(t, `{"error":{"code":"1302","message":"Rate limit reached for requests"}}`, string(body))
		waitFor(t, "the slot is freed", func() bool { return lim.InFlight() == 0 })
	})
}

// recordingBody reports whether it was closed.
type recordingBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *recordingBody) Close() error { b.closed.Store(true); return nil }

func TestTransportAdmission(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	t.Cleanup(up.Close)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)

	t.Run("a rejection is returned and the request body closed", func(t *testing.T) {
		lim := slots.NewLimiter(0)
		client := &http.Client{Transport: slots.NewTransport(base, func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() })}
		body := &recordingBody{Reader: strings.NewReader("{}")}
		req, _ := http.NewRequest(http.MethodPost, up.URL, body)
		_, err := client.Do(req)
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		assert.True(t, body.closed.Load())
	})
	t.Run("a request marked WithoutSlot takes none", func(t *testing.T) {
		lim := slots.NewLimiter(0) // would never admit
		client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })}
		req, _ := http.NewRequestWithContext(slots.WithoutSlot(context.Background()), http.MethodGet, up.URL+"/v1/models", nil)
		resp, err := client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, uint64(0), lim.Stats().Acquired)
	})
	t.Run("the caller's request is not modified", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })}
		req, _ := http.NewRequest(http.MethodGet, up.URL, nil)
		req.Header.Set("X-Org-ID", "org-a")
		before := req.Clone(context.Background())
		resp, err := client.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, before.Header, req.Header)
		assert.Equal(t, before.URL, req.URL)
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("nil admit panics with the package prefix", func(t *testing.T) {
		assert.PanicsWithValue(t, "slots: NewTransport needs an admit function", func() { slots.NewTransport(nil, nil) })
	})
}

// TestTransportUpgrade: a 101 Switching Protocols answer through the proxy
// keeps a writable body (ReverseProxy needs one) and its slot until the
// upgraded connection closes.
func TestTransportUpgrade(t *testing.T) {
	upstreamClosed := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := w.(http.Hijacker).Hijack()
		if !assert.NoError(t, err) {
			return
		}
		defer close(upstreamClosed)
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw) // echo until the client closes
	}))
	t.Cleanup(up.Close)
	lim := slots.NewLimiter(1)
	gw, _ := proxyToURL(t, up.URL, lim)

	conn, err := net.Dial("tcp", gw.Listener.Addr().String())
	require.NoError(t, err)
	fmt.Fprintf(conn, "GET /echo HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	fmt.Fprint(conn, "hello\n")
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello\n", line)
	assert.Equal(t, 1, lim.InFlight(), "the upgraded connection holds its slot")
	conn.Close()
	<-upstreamClosed
	waitFor(t, "the slot is freed with the connection", func() bool { return lim.InFlight() == 0 })
}

// Priority and flow from request headers, through a ReverseProxy whose
// Transport admits with AdmitByHeaders: an interactive request queued
// after five batch requests reaches the upstream first, and a bad
// X-Priority is answered 400 without reaching it.
func TestTransportPriorityFromHeaders(t *testing.T) {
	arrivals := make(chan string, 16)
	next := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrivals <- r.Header.Get("X-Label")
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	target, err := url.Parse(up.URL)
	require.NoError(t, err)
	lim := slots.NewLimiter(1)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	gw := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:    slots.NewTransport(base, slots.AdmitByHeaders(lim.Acquire)),
		ErrorHandler: slots.ProxyErrorHandler(),
	})
	t.Cleanup(gw.Close)
	client := newClient(t)

	post := func(label, priority string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(`{"model":"glm-5"}`))
		require.NoError(t, err)
		req.Header.Set("X-Label", label)
		req.Header.Set(slots.HeaderPriority, priority)
		req.Header.Set(slots.HeaderFlow, "org-"+label)
		resp, err := client.Do(req)
		require.NoError(t, err)
		return resp
	}
	var wg sync.WaitGroup
	send := func(label, priority string) {
		wg.Go(func() {
			resp := post(label, priority)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			assert.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.True(t, strings.HasSuffix(string(b), "data: [DONE]\n\n"), label)
		})
	}
	send("b0", "batch")
	assert.Equal(t, "b0", <-arrivals)
	for i := 1; i <= 5; i++ {
		send(fmt.Sprint("b", i), "batch")
		waitFor(t, "the batch request queues", func() bool { return lim.Waiting() == i })
	}
	send("i", "Interactive")
	waitFor(t, "the interactive request queues", func() bool { return lim.Waiting() == 6 })
	assert.Equal(t, 5, lim.Queue().Batch)

	resp := post("bad", "urgent")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, string(b), "unknown priority")

	next <- struct{}{} // b0's stream ends: its slot passes on
	assert.Equal(t, "i", <-arrivals, "the interactive request goes first")
	var order []string
	for range 6 {
		next <- struct{}{}
		if len(order) < 5 {
			order = append(order, <-arrivals)
		}
	}
	assert.Equal(t, []string{"b1", "b2", "b3", "b4", "b5"}, order)
	wg.Wait()
	waitFor(t, "every slot is released", func() bool { return lim.InFlight() == 0 })
}
