package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// seen is what an upstream saw of one request.
type seen struct {
	auth, body string
}

// recording answers 200 with a short body and records each request.
func recording(t *testing.T) (http.RoundTripper, func() []seen) {
	var mu sync.Mutex
	var all []seen
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		var b []byte
		if r.Body != nil {
			b, _ = io.ReadAll(r.Body)
			r.Body.Close()
		}
		mu.Lock()
		all = append(all, seen{auth: r.Header.Get("Authorization"), body: string(b)})
		mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
	})
	return rt, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), all...)
	}
}

// done reads resp's body to its end and closes it: an exchange that ends
// as it should, which frees its slot at once (a body closed before its end
// is a cut, whose slot lingers).
func done(t *testing.T, resp *http.Response) {
	t.Helper()
	_, err := io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
}

func tGate(t *testing.T, cfg pacing.Config) *pacing.Gate {
	t.Helper()
	g, err := pacing.NewGate("p", cfg)
	require.NoError(t, err)
	t.Cleanup(g.Close)
	return g
}

func post(t *testing.T, ctx context.Context, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.invalid/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer the-clients")
	return req
}

// The slot is held from admission until the body is read to its end, for
// the provider and the model the body names; the upstream gets the body
// as it was sent.
func TestTransportHoldsTheSlotUntilTheBodyIsDone(t *testing.T) {
	base, got := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2, Models: map[string]pacing.ModelConfig{"m": {MaxConcurrentRequests: 1}}})
	rt := pacing.NewTransport(base, gate)
	const body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	resp, err := rt.RoundTrip(post(t, t.Context(), body))
	require.NoError(t, err)
	st := gate.Status()
	assert.Equal(t, 1, st.InFlight, "held while the body is open")
	assert.Equal(t, 1, st.ByModel["m"], "under the body's model")
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(b))
	assert.Zero(t, gate.Status().InFlight, "freed at the body's end")
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, []seen{{auth: "Bearer the-clients", body: body}}, got(), "sent as it came: the body read to find the model, and the client's credential without a key pool")
}

// A granted key's credential replaces the client's; a key without a secret
// sends none.
func TestTransportPutsTheGrantedKeyOn(t *testing.T) {
	base, got := recording(t)
	gate := tGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "a", MaxConcurrentRequests: 1}, {ID: "b", MaxConcurrentRequests: 1}}})
	rt := pacing.NewTransport(base, gate, pacing.WithCredential(pacing.BearerKeys(map[string]string{"a": "secret-a"})))
	var resps []*http.Response
	for range 2 { // both held: one on each key
		resp, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
		require.NoError(t, err)
		resps = append(resps, resp)
	}
	assert.Equal(t, map[string]int{"a": 1, "b": 1}, gate.Status().ByKey)
	for _, r := range resps {
		done(t, r)
	}
	auths := []string{got()[0].auth, got()[1].auth}
	assert.ElementsMatch(t, []string{"Bearer secret-a", ""}, auths, "key a's secret, and nothing for key b")
}

// The answer is reported to the Gate before the slot is freed: a
// concurrency 429 read to its end cuts the learned cap first, so a
// request waiting for that slot is not let in under the old cap.
func TestTransportReportsBeforeItFrees(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		u := &pacingtest.Upstream{Schedule: []pacingtest.Step{{Cap: 2}}}
		u.Start()
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 3, Adaptive: &pacing.AdaptiveConfig{Initial: 3}}) // 3 at most: no probe above
		rt := pacing.NewTransport(u, gate)
		long := func() *http.Request {
			r := post(t, t.Context(), `{"model":"m"}`)
			r.Header.Set(pacingtest.ServiceHeader, "1h")
			return r
		}
		var held []*http.Response
		for range 2 {
			resp, err := rt.RoundTrip(long())
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			held = append(held, resp)
		}
		refused, err := rt.RoundTrip(long()) // the third start tests the cap of 3
		require.NoError(t, err)
		require.Equal(t, http.StatusTooManyRequests, refused.StatusCode)

		fourth := make(chan error, 1)
		go func() {
			resp, err := rt.RoundTrip(long())
			if err == nil {
				resp.Body.Close()
			}
			fourth <- err
		}()
		synctest.Wait()
		assert.Equal(t, 1, gate.Status().Queued, "the fourth waits: 3 of 3 in flight")

		_, _ = io.Copy(io.Discard, refused.Body)
		refused.Body.Close()
		synctest.Wait()
		l := gate.Learned()
		assert.Equal(t, 2, l.Cap, "the refusal cut the cap")
		assert.Equal(t, 1, gate.Status().Queued, "the fourth still waits: the cut came before the slot was freed")
		assert.Equal(t, 2, gate.Status().InFlight)
		for _, r := range held {
			r.Body.Close()
		}
		require.NoError(t, <-fourth)
	})
}

// Whatever fails, nothing stays held: the upstream unreachable, a refusal
// at the Gate, a body that names no model the Transport can read.
func TestTransportErrorsHoldNothing(t *testing.T) {
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 50})
	down := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")} // never sent: no linger
	})
	rt := pacing.NewTransport(down, gate)
	_, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.ErrorContains(t, err, "connection refused")
	assert.Zero(t, gate.Status().InFlight, "a failed round trip frees its slot")

	base, _ := recording(t)
	rt = pacing.NewTransport(base, gate)
	resp, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	_, err = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`)) // waits 50 ms, then refused
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	done(t, resp)
	assert.Zero(t, gate.Status().InFlight)

	for body, want := range map[string]string{
		`not json`:        "the request body is not a JSON object",
		`{"model":42}`:    "model: want a string",
		`{"messages":[]}`: "",
		`{"model":null}`:  "",
		`{"model":"m","x":` + strings.Repeat(" ", pacing.MaxModelBody) + `1}`: fmt.Sprintf("the request body is over %d bytes", pacing.MaxModelBody),
	} {
		resp, err := rt.RoundTrip(post(t, t.Context(), body))
		if want == "" {
			require.NoError(t, err, "a body without a model goes under the provider's caps alone")
			done(t, resp)
			continue
		}
		var bad *slots.BadRequestError
		require.ErrorAs(t, err, &bad)
		assert.Equal(t, want, bad.Reason)
	}
	assert.Zero(t, gate.Status().InFlight)
}

// In a ReverseProxy with slots.ProxyErrorHandler, a refusal is a 429 with
// Retry-After, a request whose model cannot be read a 400 (413 over the
// bound), an unreachable upstream a 502.
func TestTransportInAReverseProxy(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release
	}))
	defer up.Close()
	defer close(release)
	target, _ := url.Parse(up.URL)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 20})
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = pacing.NewTransport(up.Client().Transport, gate)
	proxy.ErrorHandler = slots.ProxyErrorHandler()
	front := httptest.NewServer(proxy)
	defer front.Close()

	first, err := http.Post(front.URL, "application/json", strings.NewReader(`{"model":"m"}`))
	require.NoError(t, err)
	defer first.Body.Close()
	for body, want := range map[string]int{`{"model":"m"}`: 429, `not json`: 400} {
		resp, err := http.Post(front.URL, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, "%s: %s", body, b)
		if want == 429 {
			assert.NotEmpty(t, resp.Header.Get("Retry-After"))
		}
	}
}

// fakeFleet records what a Transport asks of the fleet's caps.
type fakeFleet struct {
	mu       sync.Mutex
	limits   map[string]int
	acquired [][]string
	reports  []pacing.Kind
	refuse   error
	held     atomic.Int64
	// tokens caps the token keys, if set; weighed records their
	// admissions' weights.
	tokens  *registry.Registry[string]
	weighed []int
}

func (f *fakeFleet) AcquireAllN(ctx context.Context, n int, keys ...string) (*slots.Slot, error) {
	f.mu.Lock()
	f.acquired = append(f.acquired, keys)
	f.weighed = append(f.weighed, n)
	f.mu.Unlock()
	return f.tokens.AcquireAllN(ctx, n, keys...)
}

func (f *fakeFleet) AcquireAll(ctx context.Context, keys ...string) (*slots.Slot, error) {
	f.mu.Lock()
	f.acquired = append(f.acquired, keys)
	f.mu.Unlock()
	if f.refuse != nil {
		return nil, f.refuse
	}
	l := slots.NewLimiter(slots.Unlimited, slots.WithObserver(f))
	return l.TryAcquire()
}

func (f *fakeFleet) Report(s *slots.Slot, v pacing.Verdict) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, v.Kind)
}

func (f *fakeFleet) Limit(key string) int {
	if n, ok := f.limits[key]; ok {
		return n
	}
	return slots.Unlimited
}

func (f *fakeFleet) Observe(e slots.Event) {
	switch e.Kind {
	case slots.EventAcquired:
		f.held.Add(1)
	case slots.EventReleased:
		f.held.Add(-1)
	}
}

// With a fleet, a request takes the fleet's provider key (and its model's
// when the model has a fleet-wide limit) before the Gate, holds both with
// the Gate's slot, and its answer is reported to both; a fleet refusal
// asks nothing of the Gate, and a Gate refusal gives the fleet's slot back.
func TestTransportTakesTheFleetsCaps(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 20})
	f := &fakeFleet{limits: map[string]int{"model:capped": 3}}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f))

	for _, model := range []string{"capped", "other"} {
		resp, err := rt.RoundTrip(post(t, t.Context(), `{"model":"`+model+`"}`))
		require.NoError(t, err)
		assert.Equal(t, int64(1), f.held.Load(), "the fleet's slot held with the Gate's")
		done(t, resp)
		assert.Zero(t, f.held.Load())
	}
	assert.Equal(t, [][]string{{"provider", "model:capped"}, {"provider"}}, f.acquired)
	assert.Equal(t, []pacing.Kind{pacing.Admitted, pacing.Admitted}, f.reports)

	resp, err := rt.RoundTrip(post(t, t.Context(), `{"model":"other"}`))
	require.NoError(t, err)
	_, err = rt.RoundTrip(post(t, t.Context(), `{"model":"other"}`))
	require.ErrorIs(t, err, slots.ErrWaitTimeout, "the Gate refuses")
	assert.Equal(t, int64(1), f.held.Load(), "the refused request gave the fleet's slot back")
	done(t, resp)

	f.refuse = &slots.LimitError{Err: slots.ErrLimitReached, Key: "provider", Limit: 4, InFlight: 4}
	_, err = rt.RoundTrip(post(t, t.Context(), `{"model":"other"}`))
	require.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Zero(t, gate.Status().InFlight+gate.Status().Queued, "the Gate was not asked")
}

// A request sent under slots.WithoutSlot (a model listing) takes no slot
// and reports nothing.
func TestTransportWithoutSlot(t *testing.T) {
	base, got := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	f := &fakeFleet{}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), pacing.WithCredential(pacing.BearerKeys(nil)))
	held, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	resp, err := rt.RoundTrip(post(t, slots.WithoutSlot(t.Context()), `{"model":"m"}`))
	require.NoError(t, err, "not held up by the full cap")
	done(t, resp)
	done(t, held)
	assert.Len(t, f.acquired, 1)
	assert.Len(t, f.reports, 1)
	assert.Empty(t, got()[1].auth, "granted no key: the client's own credential does not reach the upstream either")
}

// WithModelName and WithModel find the model without reading the body.
func TestTransportModelWithoutTheBody(t *testing.T) {
	base, got := recording(t)
	gate := tGate(t, pacing.Config{Models: map[string]pacing.ModelConfig{"named": {MaxConcurrentRequests: 1}, "from-header": {MaxConcurrentRequests: 1}}})
	rt := pacing.NewTransport(base, gate)
	resp, err := rt.RoundTrip(post(t, pacing.WithModelName(t.Context(), "named"), `not json: never read`))
	require.NoError(t, err)
	assert.Equal(t, 1, gate.Status().ByModel["named"])
	done(t, resp)

	rt = pacing.NewTransport(base, gate, pacing.WithModel(func(r *http.Request) string { return r.Header.Get("X-Model") }))
	req := post(t, t.Context(), `not json either`)
	req.Header.Set("X-Model", "from-header")
	resp, err = rt.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, 1, gate.Status().ByModel["from-header"])
	done(t, resp)
	assert.Equal(t, "not json either", got()[1].body)
}

// The Transport's own cost over its base, per request: the body read to
// find the model aside. (Two more since the Transport tells a request
// net/http gave up before it had a connection: the httptrace hooks, 15
// and 20 before.)
func TestTransportAllocations(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 4})
	rt := pacing.NewTransport(base, gate)
	req, _ := http.NewRequestWithContext(pacing.WithModelName(context.Background(), "m"), http.MethodGet, "http://upstream.invalid/", nil)
	allocs := testing.AllocsPerRun(200, func() {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	})
	t.Logf("%.0f allocations a request", allocs)
	assert.LessOrEqual(t, allocs, 17.0)
	// A client's Accept-Encoding (a proxied request has one) is not sent
	// on: the request is copied, its headers with it.
	req.Header.Set("Accept-Encoding", "gzip")
	allocs = testing.AllocsPerRun(200, func() {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	})
	t.Logf("%.0f allocations a request with an Accept-Encoding", allocs)
	assert.LessOrEqual(t, allocs, 22.0)
	assert.Zero(t, gate.Status().InFlight)
}

// An HTTP/2 upstream whose own cap equals the Gate's, 40 requests, two in
// three clients walking away mid-stream: the upstream never has more
// streams open than the cap. A cut stream's slot is kept DefaultCutLinger
// after the Transport lets go of it, until the upstream has noticed the
// cut. (Without the linger, a run of this drew 3 open streams at the
// upstream now and then: the next request arrived before the handler of
// the cut one had returned.) The upstream counts a stream open until its
// handler returns.
func TestTransportCutStreamsStayWithinTheUpstreamsCap(t *testing.T) {
	const capacity, requests = 2, 40
	var open, peak atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := open.Add(1)
		defer open.Add(-1)
		for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 20 {
			if _, err := fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	defer up.Close()
	for _, linger := range []time.Duration{0, pacing.DefaultCutLinger} {
		open.Store(0)
		peak.Store(0)
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: capacity, MaxQueue: requests, MaxQueueWaitMS: 60_000})
		rt := pacing.NewTransport(up.Client().Transport, gate, pacing.WithCutLinger(linger))
		var wg sync.WaitGroup
		for i := range requests {
			wg.Go(func() {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
				resp, err := rt.RoundTrip(req)
				if !assert.NoError(t, err) {
					return
				}
				require.Equal(t, "HTTP/2.0", resp.Proto)
				if i%3 != 0 { // walks away after the first event
					_, _ = resp.Body.Read(make([]byte, 64))
					cancel()
					resp.Body.Close()
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		wg.Wait()
		t.Logf("linger %v: at most %d streams open at the upstream at once (cap %d)", linger, peak.Load(), capacity)
		if linger > 0 {
			assert.LessOrEqual(t, peak.Load(), int64(capacity), "the upstream's own count within the cap")
		}
		assert.Eventually(t, func() bool { return gate.Status().InFlight == 0 }, 5*time.Second, time.Millisecond, "every slot freed")
	}
}

// A Trace is told of the fleet's wait, the admission with its wait and
// what it holds, and a refusal.
func TestTransportTrace(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 20})
	f := &fakeFleet{}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f))
	var (
		fleetWaits, fleetDone int
		admitted              []pacing.Admission
		refused               []error
	)
	tr := &pacing.Trace{
		FleetWait: func() func() { fleetWaits++; return func() { fleetDone++ } },
		Admitted:  func(a pacing.Admission) { admitted = append(admitted, a) },
		Refused:   func(err error) { refused = append(refused, err) },
	}
	ctx := pacing.WithTrace(t.Context(), tr)
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	require.Len(t, admitted, 1)
	assert.Equal(t, 1, admitted[0].Grant.InFlight)
	assert.False(t, admitted[0].Held.Released())
	_, err = rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	require.Len(t, refused, 1)
	assert.ErrorIs(t, refused[0], slots.ErrWaitTimeout)
	assert.Equal(t, 2, fleetWaits)
	assert.Equal(t, 2, fleetDone)
	done(t, resp)
	assert.True(t, admitted[0].Held.Released(), "the body's end released what was held")
	// A request without a Trace is admitted as well.
	resp, err = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
}

// WithWaitContext ends a wait for admission, not the exchange of a request
// admitted before it ended.
func TestTransportWaitContext(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		u := &pacingtest.Upstream{HeaderDelay: time.Millisecond}
		u.Start()
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
		rt := pacing.NewTransport(u, gate)
		drain, drained := context.WithCancel(context.Background())
		ctx := pacing.WithWaitContext(t.Context(), drain)
		req := post(t, ctx, `{"model":"m"}`)
		req.Header.Set(pacingtest.ServiceHeader, "1s")
		held, err := rt.RoundTrip(req)
		require.NoError(t, err)
		waited := make(chan error, 1)
		go func() {
			_, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
			waited <- err
		}()
		synctest.Wait()
		drained()
		require.ErrorIs(t, <-waited, context.Canceled, "the wait ended with the drain")
		_, err = io.Copy(io.Discard, held.Body)
		require.NoError(t, err, "the admitted answer is relayed to its end")
		held.Body.Close()
		assert.Equal(t, 1, u.Counts().Served)
		assert.Zero(t, gate.Status().InFlight)
	})
}
