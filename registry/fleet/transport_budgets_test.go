package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// What a pacing.Transport takes of the fleet's budgets (WithFleetBudgets).
var (
	_ pacing.FleetReservation = (*fleet.Reservations)(nil)
	_ pacing.FleetBudgetsLeft = (*fleet.Reservations)(nil)
)

// Requests through a pacing.Transport reserve their estimates of the
// fleet's provider and model budgets before they wait, are refused at once
// (named as the Gate names its own, nothing sent) when a budget cannot take
// them, settle with the usage their answers report (the overestimate
// returned), and a request the upstream refuses charges nothing. The
// answer's headers tell what the fleet's budgets had left.
func TestTransportWithFleetBudgets(t *testing.T) {
	var sent atomic.Int32
	var refuse atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		sent.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if refuse.Load() {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"message":"slow down"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"usage":{"prompt_tokens":40,"completion_tokens":10}}`)
	}))
	defer srv.Close()

	store := memstore.New()
	provider := newBudget(t, store, "provider", upstream.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10})
	models := map[string]*fleet.Budget{"small": newBudget(t, store, "model:small", upstream.BudgetLimits{TokensPerMinute: 300})}
	gate, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 4})
	require.NoError(t, err)
	defer gate.Close()
	reserve := func(ctx context.Context, model string, cost pacing.Tokens) (pacing.FleetReservation, error) {
		rs, _, err := fleet.ReserveAll(ctx, cost, nil, provider, models[model])
		return rs, err
	}
	client := &http.Client{Transport: pacing.NewTransport(nil, gate, pacing.WithFleetBudgets(reserve), pacing.WithRateLimitHeaders())}
	send := func(est int) (*http.Response, error) {
		ctx := pacing.WithTokens(context.Background(), pacing.Tokens{Input: est - 50, Output: 50})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"model":"small"}`))
		require.NoError(t, err)
		return client.Do(req)
	}

	resp, err := send(200)
	require.NoError(t, err)
	assert.Equal(t, "100", resp.Header.Get("X-Ratelimit-Remaining-Tokens"), "the model's budget: 300 less the estimate of 200")
	assert.Equal(t, "300", resp.Header.Get("X-Ratelimit-Limit-Tokens"))
	assert.Equal(t, "9", resp.Header.Get("X-Ratelimit-Remaining-Requests"))
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	tokens, _ := used(t, models["small"])
	assert.Equal(t, 50, tokens, "settled with the usage: 150 of the estimate returned")
	tokens, requests := used(t, provider)
	assert.Equal(t, []int{50, 1}, []int{tokens, requests}, "in the provider's budget too, with its request")

	_, err = send(260)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le, "50 + 260 over the model's 300")
	assert.Equal(t, "model_"+pacing.CapTokensPerMinute, le.Cap)
	assert.Equal(t, int32(1), sent.Load(), "refused before it was sent")
	tokens, _ = used(t, provider)
	assert.Equal(t, 50, tokens, "the provider's reservation went back with it")

	refuse.Store(true)
	resp, err = send(100)
	require.NoError(t, err)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	tokens, requests = used(t, provider)
	assert.Equal(t, []int{50, 1}, []int{tokens, requests}, "refused upstream: it charges nothing")
	assert.Zero(t, gate.Status().InFlight)
}

// A pacing.Transport reserves each request's estimate of the fleet's
// budgets before the request waits for its slots, and settles them with
// the usage its answer reports; a request the budgets cannot take is
// refused before it is sent, charging nothing.
func ExampleReservations_transport() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"usage":{"prompt_tokens":900,"completion_tokens":100}}`)
	}))
	defer srv.Close()
	store := memstore.New() // each gateway's client of the fleet's Redis or PostgreSQL
	provider, _ := fleet.NewBudget(store, "provider", pacing.BudgetLimits{TokensPerMinute: 3_000}, time.Second)
	gate, _ := pacing.NewGate("provider", pacing.Config{MaxConcurrentRequests: 8})
	defer gate.Close()
	client := &http.Client{Transport: pacing.NewTransport(nil, gate, pacing.WithFleetBudgets(
		func(ctx context.Context, _ string, cost pacing.Tokens) (pacing.FleetReservation, error) {
			rs, _, err := fleet.ReserveAll(ctx, cost, nil, provider)
			return rs, err
		}))}

	for range 3 {
		ctx := pacing.WithTokens(context.Background(), pacing.Tokens{Input: 900, Output: 600}) // an estimate of 1,500
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"model":"small"}`))
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println("refused, over budget:", errors.Is(err, pacing.ErrOverBudget))
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		used, _ := provider.Used(context.Background())
		fmt.Println("sent; the minute counts", used[0], "tokens")
	}
	// Output:
	// sent; the minute counts 1000 tokens
	// sent; the minute counts 2000 tokens
	// refused, over budget: true
}
