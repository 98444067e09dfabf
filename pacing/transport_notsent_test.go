package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

type notSentBody struct{ closes atomic.Int32 }

func (b *notSentBody) Read([]byte) (int, error) { return 0, errors.New("never read") }
func (b *notSentBody) Close() error             { b.closes.Add(1); return nil }

func notSentOver() error {
	return fmt.Errorf("%w: %w", slots.ErrNotSent, &slots.LimitError{Err: pacing.ErrOverBudget, Cap: "tenant", RetryAfter: 2 * time.Second})
}

type notSentLog struct {
	mu     sync.Mutex
	events []string
}

func (l *notSentLog) add(s string) { l.mu.Lock(); l.events = append(l.events, s); l.mu.Unlock() }
func (l *notSentLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

func (l *notSentLog) trace() *pacing.Trace {
	return &pacing.Trace{
		Admitted: func(pacing.Admission) { l.add("admitted") },
		Settled:  func(st pacing.Settlement) { l.add(fmt.Sprintf("settled served=%v", st.Served)) },
		Released: func(pacing.Admission, time.Duration) { l.add("released") },
		Refused:  func(error) { l.add("refused") },
	}
}

// ErrNotSent with a response with a body: the body closed once; Settled
// once, before Released; the budgets charged nothing; nothing held.
func TestTransportNotSentWithAResponse(t *testing.T) {
	limits := pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 10}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: limits,
		APIKeys: []pacing.KeyConfig{{ID: "k", BudgetLimits: limits}},
		Models:  map[string]pacing.ModelConfig{"m": {BudgetLimits: limits}}})
	body := &notSentBody{}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: body, Request: r}, notSentOver()
	})
	var log notSentLog
	ctx := pacing.WithTrace(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 300, Output: 100}), log.trace())
	rt := pacing.NewTransport(base, gate)
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	assert.Nil(t, resp)
	require.ErrorIs(t, err, slots.ErrNotSent)
	assert.Equal(t, int32(1), body.closes.Load(), "the response's body closed once")
	assert.Zero(t, gate.Status().InFlight)
	for _, b := range gate.Budgets() {
		assert.Equal(t, b.Limit, b.Left, "%+v", b)
	}
	assert.Equal(t, []string{"admitted", "settled served=false", "released"}, log.get())
	assert.Zero(t, gate.Learned().ByKind[pacing.Other], "no answer: nothing counted as one of the upstream's")
}

// Under a bypassed grant (fail-open): Settled once, nothing released,
// nothing held.
func TestTransportNotSentBypassed(t *testing.T) {
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 1, OnWaitTimeout: pacing.Proceed,
		BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 10}})
	held, err := gate.Acquire(context.Background(), "m")
	require.NoError(t, err)
	defer held.Slot.Release()
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) { return nil, notSentOver() })
	var log notSentLog
	var bypassed bool
	tr := log.trace()
	tr.Admitted = func(a pacing.Admission) { bypassed = a.Grant.Slot.Bypassed(); log.add("admitted") }
	_, err = pacing.NewTransport(base, gate).RoundTrip(post(t, pacing.WithTrace(t.Context(), tr), `{"model":"m"}`))
	require.ErrorIs(t, err, slots.ErrNotSent)
	assert.True(t, bypassed)
	assert.Equal(t, []string{"admitted", "settled served=false"}, log.get())
	assert.Equal(t, 1, gate.Status().InFlight)
}

// With the fleet's caps and token caps: the fleet hears Other (it proves
// nothing), its slots go at once, its tokens too.
func TestTransportNotSentWithAFleet(t *testing.T) {
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2})
	tokens := registry.New[string](slots.Unlimited)
	tokens.SetLimit(pacing.FleetTokens, 10)
	f := &fakeFleet{tokens: tokens, limits: map[string]int{pacing.FleetTokens: 10}}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) { return nil, notSentOver() })
	var log notSentLog
	ctx := pacing.WithTrace(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 3, Output: 1}), log.trace())
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), pacing.WithFleetTokens(f))
	_, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.ErrorIs(t, err, slots.ErrNotSent)
	assert.Zero(t, tokens.InFlight(pacing.FleetTokens))
	assert.Zero(t, f.held.Load())
	assert.Equal(t, []pacing.Kind{pacing.Other}, f.reports)
	assert.Equal(t, []string{"admitted", "settled served=false", "released"}, log.get())
}

// The Gate's spacing of starts (requests_per_minute): a request never sent
// takes no start, as a grant given back unsent takes none: the next one
// does not wait the interval.
func TestTransportNotSentTakesNoStart(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		gate := tGate(t, pacing.Config{RequestsPerMinute: 6, BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 10}}) // 10 s apart
		var n atomic.Int32
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 1 {
				return nil, notSentOver()
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		rt := pacing.NewTransport(base, gate)
		_, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
		require.ErrorIs(t, err, slots.ErrNotSent)
		start := time.Now()
		resp, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Zero(t, time.Since(start), "the request not sent took no start of the upstream's")
	})
}

// A Trace whose Settled panics for a request not sent: the slot goes, the
// budgets stay returned, the panic goes on.
func TestTransportNotSentSettledPanics(t *testing.T) {
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 10}})
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) { return nil, notSentOver() })
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{Settled: func(pacing.Settlement) { panic("hook") }})
	assert.PanicsWithValue(t, "hook", func() { _, _ = pacing.NewTransport(base, gate).RoundTrip(post(t, ctx, `{"model":"m"}`)) })
	assert.Zero(t, gate.Status().InFlight)
	for _, b := range gate.Budgets() {
		assert.Equal(t, b.Limit, b.Left)
	}
}

// A request that never connects (net/http's dial error, as a real
// refused dial gives it) never reached the upstream: as one its base did
// not send, it charges the budgets nothing, and its Trace hears it settled
// unserved. Before dial errors were taken as unsent, each spent a request
// of MaxRequestsPerMinute and its estimate's tokens: the third attempt
// was refused over budget instead of failing to dial.
func TestTransportDialErrorChargesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens: every dial is refused
	gate := tGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000, MaxRequestsPerMinute: 2}})
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	rt := pacing.NewTransport(base, gate)
	for i := range 3 {
		var log notSentLog
		ctx := pacing.WithTrace(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100, Output: 100}), log.trace())
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		_, err = rt.RoundTrip(req)
		var op *net.OpError
		require.ErrorAs(t, err, &op, "attempt %d", i)
		assert.Equal(t, "dial", op.Op, "attempt %d", i)
		assert.Equal(t, []string{"admitted", "settled served=false", "released"}, log.get(), "attempt %d", i)
	}
	for _, b := range gate.Budgets() {
		assert.Equal(t, b.Limit, b.Left, "a request never sent charged %+v", b)
	}
	assert.Zero(t, gate.Status().InFlight)
}

// As TestTransportNotSentTakesNoStart, for a request that failed to dial:
// it takes no start of the Gate's spacing, so the next request does not
// wait the interval. Before, the dial error took a start and the next
// request waited 10 s (of the bubble's time).
func TestTransportDialErrorTakesNoStart(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		gate := tGate(t, pacing.Config{RequestsPerMinute: 6}) // 10 s apart
		var n atomic.Int32
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 1 {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		rt := pacing.NewTransport(base, gate)
		_, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		start := time.Now()
		resp, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Zero(t, time.Since(start), "the request never sent took no start of the upstream's")
	})
}
