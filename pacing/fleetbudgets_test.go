package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// spend is a FleetReservation that records what the Transport asks of it.
type spend struct {
	mu       sync.Mutex
	calls    []string
	startErr error
	left     [4]int
	limits   [4]int
}

func (s *spend) add(call string) {
	s.mu.Lock()
	s.calls = append(s.calls, call)
	s.mu.Unlock()
}

func (s *spend) Start(context.Context) error { s.add("start"); return s.startErr }
func (s *spend) Settle(_ context.Context, used pacing.Tokens) error {
	s.add(fmt.Sprintf("settle %d+%d", used.Input, used.Output))
	return nil
}
func (s *spend) Cancel(context.Context) error { s.add("cancel"); return nil }

func (s *spend) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// spendLeft is a spend that tells what its budgets had left.
type spendLeft struct{ spend }

func (s *spendLeft) Left() (left, limits [4]int) { return s.left, s.limits }

// answering returns a base that answers every request with status and
// body (JSON), counting the requests it got.
func answering(status int, body string) (http.RoundTripper, func() int) {
	var mu sync.Mutex
	n := 0
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Body != nil {
				_, _ = io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
			mu.Lock()
			n++
			mu.Unlock()
			return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
		}), func() int {
			mu.Lock()
			defer mu.Unlock()
			return n
		}
}

const usageAnswer = `{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`

// A request reserves the fleet's budgets first, with its model and cost,
// before it takes any slot; starts them once it holds its slots; and
// settles them with the usage its answer reports.
func TestFleetBudgetsReservedStartedSettled(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2})
	s := &spend{}
	var reserved []string
	rt := pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(_ context.Context, model string, cost pacing.Tokens) (pacing.FleetReservation, error) {
		reserved = append(reserved, fmt.Sprintf("%s %d+%d, %d in flight", model, cost.Input, cost.Output, gate.Status().InFlight))
		return s, nil
	}))
	ctx := pacing.WithTokens(t.Context(), pacing.Tokens{Input: 10, Output: 20})
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	assert.Equal(t, []string{"m 10+20, 0 in flight"}, reserved, "reserved before the Gate admits it")
	assert.Equal(t, []string{"start"}, s.Calls(), "started as it is sent")
	done(t, resp)
	assert.Equal(t, []string{"start", "settle 3+5"}, s.Calls(), "settled with the answer's usage")
	assert.Equal(t, 1, sent())

	// Without WithTokens it costs nothing but the request, and its answer
	// settles nothing: the estimate stands.
	s2 := &spend{}
	rt = pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(_ context.Context, _ string, cost pacing.Tokens) (pacing.FleetReservation, error) {
		assert.Zero(t, cost, "unweighed")
		return s2, nil
	}))
	resp, err = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Equal(t, []string{"start"}, s2.Calls())
}

// A budget that refuses at the reservation refuses the request before it
// takes anything: nothing is sent or held, the Trace hears the refusal, and
// a model's budget is named as the Gate names its own (on a copy).
func TestFleetBudgetsRefusalHoldsNothing(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2})
	f := &fakeFleet{}
	refusal := &slots.LimitError{Err: pacing.ErrOverBudget, Key: "model:m", Cap: pacing.CapTokensPerMinute, Limit: 100}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		return nil, refusal
	}))
	var heard []string
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{
		Admitted: func(pacing.Admission) { heard = append(heard, "admitted") },
		Refused:  func(error) { heard = append(heard, "refused") },
	})
	_, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, pacing.ErrOverBudget)
	assert.Equal(t, "model_"+pacing.CapTokensPerMinute, le.Cap)
	assert.Equal(t, pacing.CapTokensPerMinute, refusal.Cap, "the budget's own error is left as it was")
	status, _ := slots.HTTPStatus(err)
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, []string{"refused"}, heard)
	assert.Zero(t, sent())
	assert.Empty(t, f.acquired, "no fleet cap taken")
	assert.Zero(t, gate.Status().InFlight)

	// A refusal named already keeps its name, whatever its key (a tenant's
	// named "model:x", say).
	refusal = &slots.LimitError{Err: pacing.ErrOverBudget, Key: "model:x/m", Cap: "tenant_" + pacing.CapTokensPerMinute}
	_, err = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "tenant_"+pacing.CapTokensPerMinute, le.Cap)

	// The provider's budget keeps its name.
	refusal = &slots.LimitError{Err: pacing.ErrOverBudget, Key: "provider", Cap: pacing.CapTokensPerMinute}
	_, err = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.ErrorAs(t, err, &le)
	assert.Equal(t, pacing.CapTokensPerMinute, le.Cap)

	// Another error refuses it as well, as it is.
	refusal = nil
	down := errors.New("the budgets' store cannot be reached")
	rt = pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		return nil, down
	}))
	_, err = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	assert.ErrorIs(t, err, down)
	assert.Zero(t, sent())
}

// A budget that refuses at the start (its request waited past the
// budget's minute, say) keeps the request from being sent: its slots are
// freed, the Gate's budgets and spacing charge it nothing, the reservation
// is cancelled, and the Trace hears a refusal, not an admission. Another
// error at the start lets it go.
func TestFleetBudgetsRefusedAtTheStart(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	s := &spend{startErr: &slots.LimitError{Err: pacing.ErrOverBudget, Key: "model:m", Cap: pacing.CapTokensPerMinute}}
	rt := pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		return s, nil
	}))
	var heard []string
	ctx := pacing.WithTrace(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), &pacing.Trace{
		Admitted: func(pacing.Admission) { heard = append(heard, "admitted") },
		Refused:  func(error) { heard = append(heard, "refused") },
		Settled:  func(pacing.Settlement) { heard = append(heard, "settled") },
	})
	_, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "model_"+pacing.CapTokensPerMinute, le.Cap)
	assert.Zero(t, sent(), "not sent")
	assert.Equal(t, []string{"start", "cancel"}, s.Calls())
	assert.Equal(t, []string{"refused"}, heard)
	st := gate.Status()
	assert.Zero(t, st.InFlight)
	require.NotEmpty(t, st.Budgets)
	assert.Equal(t, 1000, st.Budgets[0].Left, "the Gate's budget charged nothing")
	assert.True(t, st.LastStart.IsZero(), "nor its spacing")

	s.startErr = errors.New("the store did not answer")
	resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), `{"model":"m"}`))
	require.NoError(t, err, "a store's error at the start lets it go")
	done(t, resp)
	assert.Equal(t, []string{"start", "cancel", "start", "settle 3+5"}, s.Calls())
}

// What a request reserved is cancelled whole when it charges nothing: the
// Gate refuses it, the upstream refuses it, or it is never sent; a 4xx
// settles with no tokens (it was sent); a failed exchange leaves the
// estimate standing.
func TestFleetBudgetsCancelledWhenNothingIsUsed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		base  http.RoundTripper
		gate  pacing.Config
		block bool // hold the Gate's one slot first
		calls []string
	}{
		{"refused by the Gate", roundTripFunc(nil), pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 10}, true, []string{"cancel"}},
		{"refused upstream", nil, pacing.Config{}, false, []string{"start", "cancel"}},
		{"not sent", roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Body.Close()
			return nil, fmt.Errorf("no: %w", slots.ErrNotSent)
		}), pacing.Config{}, false, []string{"start", "cancel"}},
		{"a client error", nil, pacing.Config{}, false, []string{"start", "settle 0+0"}},
		{"a failed exchange", roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Body.Close()
			return nil, errors.New("connection reset")
		}), pacing.Config{}, false, []string{"start"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := tc.base
			switch tc.name {
			case "refused upstream":
				base, _ = answering(http.StatusTooManyRequests, `{"error":{"message":"slow down"}}`)
			case "a client error":
				base, _ = answering(http.StatusBadRequest, `{"error":{"message":"bad"}}`)
			case "refused by the Gate":
				base, _ = answering(200, usageAnswer)
			}
			gate := tGate(t, tc.gate)
			if tc.block {
				gr, err := gate.Acquire(t.Context(), "m")
				require.NoError(t, err)
				defer gr.Slot.Release()
			}
			s := &spend{}
			rt := pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
				return s, nil
			}))
			resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 7}), `{"model":"m"}`))
			if err == nil {
				done(t, resp)
			}
			assert.Equal(t, tc.calls, s.Calls())
		})
	}
}

// With WithRateLimitHeaders, an answer's headers count the fleet's
// budgets beside the Gate's: the tightest of them.
func TestFleetBudgetsInTheRateLimitHeaders(t *testing.T) {
	base, _ := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	s := &spendLeft{}
	s.left, s.limits = [4]int{40, 0, 0, 9}, [4]int{500, 0, 0, 10}
	rt := pacing.NewTransport(base, gate, pacing.WithRateLimitHeaders(), pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		return s, nil
	}))
	resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Equal(t, "500", resp.Header.Get("X-Ratelimit-Limit-Tokens"), "the fleet's budget has less left than the Gate's")
	assert.Equal(t, "40", resp.Header.Get("X-Ratelimit-Remaining-Tokens"))
	assert.Equal(t, "10", resp.Header.Get("X-Ratelimit-Limit-Requests"))
	assert.Equal(t, "9", resp.Header.Get("X-Ratelimit-Remaining-Requests"))
}

// Many requests at once, some refused by the Gate, some by the upstream,
// some served: every reservation is started at most once, before it ends,
// and ended (settled or cancelled) exactly once; nothing is held after.
func TestFleetBudgetsHammer(t *testing.T) {
	var mu sync.Mutex
	n := 0
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		mu.Lock()
		n++
		status := []int{200, 200, 429, 400}[n%4]
		mu.Unlock()
		return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(usageAnswer)), Request: r}, nil
	})
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 3, MaxQueue: 8, MaxQueueWaitMS: 5})
	var all []*spend
	var allMu sync.Mutex
	rt := pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		s := &spend{}
		allMu.Lock()
		all = append(all, s)
		allMu.Unlock()
		return s, nil
	}))
	var wg sync.WaitGroup
	for range 60 {
		wg.Go(func() {
			resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 2}), `{"model":"m"}`))
			if err == nil {
				done(t, resp)
			}
		})
	}
	wg.Wait()
	require.Len(t, all, 60)
	for i, s := range all {
		calls := s.Calls()
		ends := 0
		for j, c := range calls {
			if c == "start" {
				assert.Zero(t, j, "reservation %d: started first, once: %v", i, calls)
				continue
			}
			ends++
		}
		assert.Equal(t, 1, ends, "reservation %d: ended once: %v", i, calls)
	}
	assert.Zero(t, gate.Status().InFlight)
}
