package pacing_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// Each Trace told Admitted is told Released, also when one attached
// before it panics in its own Released (logged, and gone no further): a
// metrics adapter attached after the program's Trace still pairs its
// admission with a release. Before, the first panic ended the round, and
// the Traces after it never heard Released.
func TestTraceReleasedPanicTellsTheOthers(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	rt := pacing.NewTransport(base, gate)
	var admitted, released int
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{Released: func(pacing.Admission, time.Duration) { panic("program's bug") }})
	ctx = pacing.WithTrace(ctx, &pacing.Trace{
		Admitted: func(pacing.Admission) { admitted++ },
		Released: func(pacing.Admission, time.Duration) { released++ },
	})
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Zero(t, gate.Status().InFlight)
	assert.Equal(t, 1, admitted)
	assert.Equal(t, 1, released, "told Released after the Trace before it panicked")
}

// Waiting is called once per request, as its wait begins (its model
// read), before Admitted or Refused; not for a request refused before it
// waits (its wait context ended already).
func TestTraceWaitingComesFirst(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	rt := pacing.NewTransport(base, gate)
	var told []string
	tr := &pacing.Trace{
		Waiting:  func() { told = append(told, "waiting") },
		Admitted: func(pacing.Admission) { told = append(told, "admitted") },
		Refused:  func(error) { told = append(told, "refused") },
	}
	resp, err := rt.RoundTrip(post(t, pacing.WithTrace(t.Context(), tr), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Equal(t, []string{"waiting", "admitted"}, told)

	told = nil
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = rt.RoundTrip(post(t, pacing.WithWaitContext(pacing.WithTrace(t.Context(), tr), ended), `{"model":"m"}`))
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []string{"refused"}, told, "refused before it waited")
}
