package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

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
	var settled []pacing.Tokens
	bypassed := false
	send("/", &pacing.Trace{
		Admitted: func(a pacing.Admission) { bypassed = a.Held.Bypassed() },
		Settled:  func(u pacing.Tokens) { settled = append(settled, u) },
	})
	close(hold)
	<-done
	require.True(t, bypassed)
	assert.Equal(t, []pacing.Tokens{{Input: 7, Output: 2}}, settled)
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
	var settled []pacing.Tokens
	ctx := pacing.WithTrace(pacing.WithTokens(context.Background(), pacing.Tokens{Input: 100, Output: 900}),
		&pacing.Trace{Settled: func(u pacing.Tokens) { settled = append(settled, u) }})
	req, err := http.NewRequestWithContext(pacing.WithModelName(ctx, "m"), http.MethodPost, srv.URL, nil)
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, 10_000, providerBudget(t, g.Status(), pacing.CapTokensPerMinute).Left, "the Gate gave it back")
	assert.Equal(t, []pacing.Tokens{{}}, settled, "the caller is told it charges nothing too")
}

// An answer that refused the request (503, 400) is no request of the
// upstream's, with WithTokens or without: the Gate's requests budget takes
// it back and Trace.Settled is told nothing was charged; a served request
// stays counted, and without WithTokens Settled is not called for it.
func TestTraceSettledRequests(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, `{"usage":{"prompt_tokens":7,"completion_tokens":2}}`)
	}))
	defer srv.Close()
	g := newGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 100}})
	client := &http.Client{Transport: pacing.NewTransport(srv.Client().Transport, g)}
	send := func(weighed bool) []pacing.Tokens {
		var settled []pacing.Tokens
		ctx := pacing.WithTrace(context.Background(), &pacing.Trace{Settled: func(u pacing.Tokens) { settled = append(settled, u) }})
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
	for _, weighed := range []bool{false, true} {
		for _, status = range []int{http.StatusBadRequest, http.StatusServiceUnavailable} {
			assert.Equal(t, []pacing.Tokens{{}}, send(weighed), "weighed %v, status %d", weighed, status)
			assert.Equal(t, 100, left(), "weighed %v, status %d: not counted", weighed, status)
		}
	}
	status = http.StatusOK
	assert.Empty(t, send(false), "served without WithTokens: nothing to settle")
	assert.Equal(t, 99, left())
	assert.Equal(t, []pacing.Tokens{{Input: 7, Output: 2}}, send(true))
	assert.Equal(t, 98, left(), "served: counted")
	status = http.StatusTooManyRequests // last: the Gate pauses after it
	assert.Equal(t, []pacing.Tokens{{}}, send(false))
	assert.Equal(t, 98, left(), "refused for a rate: not counted")
}
