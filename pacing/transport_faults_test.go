package pacing_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

type countingBody struct {
	io.Reader
	closes atomic.Int32
}

func (b *countingBody) Close() error { b.closes.Add(1); return nil }

func postCounting(t *testing.T, ctx context.Context, body string) (*http.Request, *countingBody) {
	req := post(t, ctx, body)
	b := &countingBody{Reader: strings.NewReader(body)}
	req.Body = b
	req.GetBody = nil
	return req, b
}

// A body whose model cannot be read is closed once, as a RoundTripper
// that does not send must.
func TestTransportClosesABadBodyOnce(t *testing.T) {
	base, _ := recording(t)
	rt := pacing.NewTransport(base, tGate(t, pacing.Config{MaxConcurrentRequests: 1}))
	for _, body := range []string{`not json`, `{"model":42}`, `{"model":"m","x":` + strings.Repeat(" ", pacing.MaxModelBody) + `1}`} {
		req, b := postCounting(t, t.Context(), body)
		_, err := rt.RoundTrip(req)
		require.Error(t, err)
		assert.Equal(t, int32(1), b.closes.Load(), "closes of %.20q", body)
	}
}

// A Trace's FleetWait end that panics leaves no fleet slot held.
func TestTransportTracePanicAfterTheFleetFreesItsSlot(t *testing.T) {
	base, _ := recording(t)
	f := &fakeFleet{}
	rt := pacing.NewTransport(base, tGate(t, pacing.Config{MaxConcurrentRequests: 1}), pacing.WithFleet(f))
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{FleetWait: func() func() { return func() { panic("metrics") } }})
	func() {
		defer func() { recover() }()
		rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	}()
	assert.Zero(t, f.held.Load(), "fleet slot held after the panic")
}

// A Trace's Admitted that panics leaves neither the Gate's slot nor the
// fleet's held.
func TestTraceAdmittedPanicFreesTheSlots(t *testing.T) {
	base, _ := recording(t)
	f := &fakeFleet{}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f))
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{Admitted: func(pacing.Admission) { panic("metrics") }})
	func() {
		defer func() { recover() }()
		rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	}()
	assert.Zero(t, f.held.Load(), "fleet slot held after the panic")
	assert.Zero(t, gate.Status().InFlight, "gate slot held after the panic")
}

// A credential function that panics frees the slot and closes the body.
func TestTransportCredentialPanic(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 1}}})
	rt := pacing.NewTransport(base, gate, pacing.WithCredential(func(http.Header, string) { panic("vault") }))
	req, b := postCounting(t, pacing.WithModelName(t.Context(), "m"), `{"model":"m"}`)
	func() {
		defer func() { recover() }()
		rt.RoundTrip(req)
	}()
	assert.Zero(t, gate.Status().InFlight)
	assert.Equal(t, int32(1), b.closes.Load(), "request body closed")
}

// A grant bypassed at the longest wait ("proceed") under a key pool sends
// no key of the pool and not the client's own credential either; the
// fleet, whose slot it holds, is told of its answer.
func TestTransportBypassSendsNoClientCredential(t *testing.T) {
	base, got := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 20, OnWaitTimeout: pacing.Proceed,
		APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 1}}})
	f := &fakeFleet{}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), pacing.WithCredential(pacing.BearerKeys(map[string]string{"k1": "sk-secret"})))
	first, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	second, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, second)
	done(t, first)
	s := got()
	require.Len(t, s, 2)
	assert.Equal(t, "Bearer sk-secret", s[0].auth)
	assert.Empty(t, s[1].auth, "granted no key: no credential")
	assert.Len(t, f.reports, 2, "the fleet told of the bypassed request's answer")
}

// A wait context that ended before the request came admits nothing (it
// used to race the admission: 150 of 200 admitted).
func TestTransportWaitContextEndedBefore(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 100})
	rt := pacing.NewTransport(base, gate)
	drain, drained := context.WithCancel(context.Background())
	drained()
	admitted := 0
	for range 200 {
		resp, err := rt.RoundTrip(post(t, pacing.WithWaitContext(t.Context(), drain), `{"model":"m"}`))
		if err == nil {
			admitted++
			done(t, resp)
		}
	}
	t.Logf("admitted %d of 200 with an ended wait context", admitted)
	assert.Zero(t, admitted)
}
