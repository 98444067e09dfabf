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
