package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// Trace.Settled is told the usage of a request admitted under WithTokens
// without a slot (on_wait_timeout "proceed") too.
func TestTraceSettledOnBypass(t *testing.T) {
	hold := make(chan struct{})
	entered := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-hold
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"usage":{"prompt_tokens":7,"completion_tokens":2}}`)
	}))
	defer srv.Close()
	g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 20, OnWaitTimeout: pacing.Proceed})
	client := &http.Client{Transport: pacing.NewTransport(srv.Client().Transport, g)}
	send := func(path string, tr *pacing.Trace) {
		ctx := pacing.WithTrace(pacing.WithTokens(context.Background(), pacing.Tokens{Input: 100, Output: 900}), tr)
		req, err := http.NewRequestWithContext(pacing.WithModelName(ctx, "m"), http.MethodPost, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	done := make(chan struct{})
	go func() { send("/hold", &pacing.Trace{}); close(done) }()
	<-entered
	var settled []pacing.Settlement
	bypassed := false
	send("/", &pacing.Trace{
		Admitted: func(a pacing.Admission) { bypassed = a.Held.Bypassed() },
		Settled:  func(st pacing.Settlement) { settled = append(settled, st) },
	})
	close(hold)
	<-done
	require.True(t, bypassed)
	assert.Equal(t, []pacing.Settlement{{Served: true, Used: pacing.Tokens{Input: 7, Output: 2}}}, settled)
}

// An answer refused as overloaded (503) gives the Gate's budgets back, and
// Trace.Settled tells the caller so (nothing charged), for its own.
func TestTraceSettledOnRefusal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"message":"overloaded"}}`)
	}))
	defer srv.Close()
	g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 10_000}})
	client := &http.Client{Transport: pacing.NewTransport(srv.Client().Transport, g)}
	var settled []pacing.Settlement
	ctx := pacing.WithTrace(pacing.WithTokens(context.Background(), pacing.Tokens{Input: 100, Output: 900}),
		&pacing.Trace{Settled: func(st pacing.Settlement) { settled = append(settled, st) }})
	req, err := http.NewRequestWithContext(pacing.WithModelName(ctx, "m"), http.MethodPost, srv.URL, nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, 10_000, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left, "the Gate gave it back")
	assert.Equal(t, []pacing.Settlement{{}}, settled, "the caller is told it charges nothing too")
}

// An answer that refused the request (503, 429) is no request of the
// upstream's, with WithTokens or without: the Gate's requests budget takes
// it back and Trace.Settled is told it was not served. Another 4xx (400)
// was sent: its tokens come back, its request stays counted. A served
// request stays counted, even one that reports no usage at all, and
// without WithTokens Settled is not called for it.
func TestTraceSettledRequests(t *testing.T) {
	status, usage := http.StatusOK, `{"prompt_tokens":7,"completion_tokens":2}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"usage":%s}`, usage)
	}))
	defer srv.Close()
	g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 100}})
	client := &http.Client{Transport: pacing.NewTransport(srv.Client().Transport, g)}
	send := func(weighed bool) []pacing.Settlement {
		var settled []pacing.Settlement
		ctx := pacing.WithTrace(context.Background(), &pacing.Trace{Settled: func(st pacing.Settlement) { settled = append(settled, st) }})
		if weighed {
			ctx = pacing.WithTokens(ctx, pacing.Tokens{Input: 10})
		}
		req, err := http.NewRequestWithContext(pacing.WithModelName(ctx, "m"), http.MethodPost, srv.URL, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return settled
	}
	left := func() int { return providerBudget(t, g.Status(), pacing.CapMaxRequestsPerMinute).Left }
	want := 100
	for _, weighed := range []bool{false, true} {
		status = http.StatusServiceUnavailable
		assert.Equal(t, []pacing.Settlement{{}}, send(weighed), "weighed %v: refused", weighed)
		assert.Equal(t, want, left(), "weighed %v: refused, not counted", weighed)
		status = http.StatusBadRequest
		assert.Equal(t, []pacing.Settlement{{Served: true}}, send(weighed), "weighed %v: a client error", weighed)
		want--
		assert.Equal(t, want, left(), "weighed %v: a client error was sent: counted", weighed)
	}
	status = http.StatusOK
	assert.Empty(t, send(false), "served without WithTokens: nothing to settle")
	want--
	assert.Equal(t, want, left())
	assert.Equal(t, []pacing.Settlement{{Served: true, Used: pacing.Tokens{Input: 7, Output: 2}}}, send(true))
	want--
	assert.Equal(t, want, left(), "served: counted")
	usage = `{"prompt_tokens":0,"completion_tokens":0}`
	assert.Equal(t, []pacing.Settlement{{Served: true}}, send(true), "served, and used nothing")
	want--
	assert.Equal(t, want, left(), "served: counted, whatever it used")
	status = http.StatusTooManyRequests // last: the Gate pauses after it
	assert.Equal(t, []pacing.Settlement{{}}, send(false))
	assert.Equal(t, want, left(), "refused for a rate: not counted")
}

// A Trace.Settled that panics for an error answer its client left unread
// runs where the request's context ends, on the Transport's watch of it:
// the process goes on (it crashed), and the slots are freed.
func TestTraceSettledPanicAtTheContextsEnd(t *testing.T) {
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{},
			Body: io.NopCloser(strings.NewReader(`{"error":{}}`)), Request: r}, nil
	})
	rt := pacing.NewTransport(base, gate, pacing.WithCutLinger(0))
	ctx, cancel := context.WithCancel(context.Background())
	ctx = pacing.WithTrace(ctx, &pacing.Trace{Settled: func(pacing.Settlement) { panic("a hook's bug") }})
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	cancel() // the client goes away without reading the answer
	require.Eventually(t, func() bool { return gate.Status().InFlight == 0 }, 10*time.Second, time.Millisecond)
	assert.NoError(t, resp.Body.Close())
}
