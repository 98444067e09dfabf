package pacing_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// With the fleet's token caps set, a request takes them after its request
// caps, weighing what it weighs in the Gate, holds them until its body is
// done, and gives them back when the Gate refuses it; a request heavier
// than a token cap is refused with that cap named, holding nothing.
func TestTransportTakesTheFleetsTokenCaps(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2, MaxQueue: 1, MaxQueueWaitMS: 20})
	tokens := registry.New[string](slots.Unlimited)
	tokens.SetLimit(pacing.FleetTokens, 10)
	tokens.SetLimit(pacing.FleetModelTokens+"m", 6)
	f := &fakeFleet{tokens: tokens, limits: map[string]int{pacing.FleetTokens: 10, pacing.FleetModelTokens + "m": 6}}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), pacing.WithFleetTokens(f))
	weigh := func(n int) context.Context {
		return pacing.WithTokens(t.Context(), pacing.Tokens{Input: n - 1, Output: 1})
	}

	resp, err := rt.RoundTrip(post(t, weigh(4), `{"model":"m"}`))
	require.NoError(t, err)
	assert.Equal(t, 4, tokens.InFlight(pacing.FleetTokens), "the request's 4 tokens, fleet wide")
	assert.Equal(t, 4, tokens.InFlight(pacing.FleetModelTokens+"m"))
	other, err := rt.RoundTrip(post(t, t.Context(), `{"model":"other"}`))
	require.NoError(t, err, "unweighed, and of a model without a token cap")
	assert.Equal(t, 5, tokens.InFlight(pacing.FleetTokens), "an unweighed request weighs one token, as in the Gate")
	assert.Equal(t, [][]string{{"provider"}, {pacing.FleetTokens, pacing.FleetModelTokens + "m"}, {"provider"}, {pacing.FleetTokens}}, f.acquired)
	assert.Equal(t, []int{4, 1}, f.weighed)

	_, err = rt.RoundTrip(post(t, weigh(2), `{"model":"m"}`))
	require.ErrorIs(t, err, slots.ErrWaitTimeout, "the Gate refuses: both its requests are held")
	assert.Equal(t, 5, tokens.InFlight(pacing.FleetTokens), "the refused request gave its tokens back")
	assert.Equal(t, int64(2), f.held.Load(), "and its request caps")

	_, err = rt.RoundTrip(post(t, weigh(7), `{"model":"m"}`))
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, slots.ErrExceedsLimit)
	assert.Equal(t, pacing.CapModelTokens, le.Cap, "the model's token cap named")
	assert.Equal(t, int64(2), f.held.Load(), "holding nothing")

	done(t, resp)
	done(t, other)
	assert.Zero(t, tokens.InFlight(pacing.FleetTokens), "freed with the bodies")
	assert.Zero(t, tokens.InFlight(pacing.FleetModelTokens+"m"))
	assert.Zero(t, f.held.Load())
}

// Many weighed requests at once through a fleet's token cap of 12, most of
// them waiting for tokens: every one is admitted in turn, and every token
// and request cap is freed with the bodies.
func TestTransportFleetTokensHammer(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxQueue: 100})
	tokens := registry.New[string](slots.Unlimited)
	tokens.SetLimit(pacing.FleetTokens, 12)
	f := &fakeFleet{tokens: tokens, limits: map[string]int{pacing.FleetTokens: 12}}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), pacing.WithFleetTokens(f))
	var wg sync.WaitGroup
	for i := range 40 {
		n := 1 + i%5
		wg.Go(func() {
			resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: n}), `{"model":"m"}`))
			if !assert.NoError(t, err) {
				return
			}
			done(t, resp)
		})
	}
	wg.Wait()
	assert.Zero(t, tokens.InFlight(pacing.FleetTokens))
	assert.Zero(t, f.held.Load())
}
