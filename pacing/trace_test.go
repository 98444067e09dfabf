package pacing_test

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// Two Traces on one request (a metrics adapter's and the program's own)
// are each told everything, in the order they were attached; a nil one
// adds nothing.
func TestTracesAttachedTogether(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 20})
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(&fakeFleet{}))
	var told []string
	traceOf := func(name string) *pacing.Trace {
		return &pacing.Trace{
			FleetWait: func() func() {
				told = append(told, name+" waits")
				return func() { told = append(told, name+" waited") }
			},
			Admitted: func(pacing.Admission) { told = append(told, name+" admitted") },
			Refused:  func(error) { told = append(told, name+" refused") },
			Released: func(pacing.Admission, time.Duration) { told = append(told, name+" released") },
		}
	}
	ctx := pacing.WithTrace(pacing.WithTrace(pacing.WithTrace(t.Context(), traceOf("a")), nil), traceOf("b"))
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	_, err = rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	done(t, resp)
	assert.Equal(t, []string{
		"a waits", "b waits", "a waited", "b waited", "a admitted", "b admitted",
		"a waits", "b waits", "a waited", "b waited", "a refused", "b refused",
		"a released", "b released",
	}, told)
}

// Released is told once the slots are free, with how long they were held:
// when the body ends, after the linger for a cut stream, and when the
// exchange fails; not for a bypass, which held nothing. In virtual time.
func TestTraceReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
		var failing atomic.Bool
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if failing.Load() {
				return nil, errors.New("connection reset")
			}
			return (&http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}), nil
		})
		rt := pacing.NewTransport(slowBody(base, time.Second), gate, pacing.WithCutLinger(50*time.Millisecond))
		var mu sync.Mutex // Released may be told on a timer's goroutine
		var held []time.Duration
		var inFlight []int
		ctx := pacing.WithTrace(t.Context(), &pacing.Trace{Released: func(a pacing.Admission, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			held = append(held, d)
			inFlight = append(inFlight, gate.Status().InFlight)
			assert.True(t, a.Held.Released(), "its Admission, its slots free")
		}})
		told := func() []time.Duration {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(held)
		}

		resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
		assert.Empty(t, told(), "not while the body is read")
		done(t, resp)
		require.Equal(t, []time.Duration{time.Second}, told(), "its body took a second")

		// A stream cut by its client keeps its slot the linger more.
		resp, err = rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Len(t, told(), 1, "not before the linger")
		time.Sleep(time.Second)
		synctest.Wait()
		require.Len(t, told(), 2)
		assert.Equal(t, 50*time.Millisecond, told()[1])

		// A failed exchange frees its slots too (after the linger: it may
		// have been sent).
		failing.Store(true)
		_, err = rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
		require.Error(t, err)
		time.Sleep(time.Second)
		synctest.Wait()
		require.Len(t, told(), 3)
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []int{0, 0, 0}, inFlight, "told once the slots are free")
	})
}

// A bypass (fail-open) holds nothing, so nothing is released; a Released
// that panics is logged and frees the slots all the same.
func TestTraceReleasedBypassAndPanic(t *testing.T) {
	base, _ := recording(t)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 10, OnWaitTimeout: "proceed"})
	rt := pacing.NewTransport(base, gate)
	var released int
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{Released: func(pacing.Admission, time.Duration) { released++ }})
	first, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	bypass, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err, "proceeds without a slot")
	done(t, bypass)
	assert.Zero(t, released, "a bypass holds nothing")
	done(t, first)
	assert.Equal(t, 1, released)

	ctx = pacing.WithTrace(t.Context(), &pacing.Trace{Released: func(pacing.Admission, time.Duration) { panic("metrics") }})
	resp, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Zero(t, gate.Status().InFlight)
	resp, err = rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.NoError(t, err, "no capacity lost")
	done(t, resp)
}

// slowBody answers as base does, with a body that ends d after the answer
// came.
func slowBody(base http.RoundTripper, d time.Duration) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := base.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		resp.Body = &lateEOF{until: time.Now().Add(d)}
		return resp, nil
	})
}

// lateEOF is a body that ends at until.
type lateEOF struct{ until time.Time }

func (b *lateEOF) Read([]byte) (int, error) {
	time.Sleep(time.Until(b.until))
	return 0, io.EOF
}

func (b *lateEOF) Close() error { return nil }

// A Trace whose Admitted panics leaves the slots free; the Traces told
// Admitted before it (and it) hear Released, those after it hear neither.
// A FleetWait that panics ends the waits that began before it, each even
// if another's end panics, and its own panic is the one that goes on.
func TestTracePanicsKeepTheCountsPaired(t *testing.T) {
	base, _ := recording(t)
	f := &fakeFleet{}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f))
	type counts struct{ admitted, released, waiting int }
	counting := func(c *counts) *pacing.Trace {
		return &pacing.Trace{
			FleetWait: func() func() { c.waiting++; return func() { c.waiting-- } },
			Admitted:  func(pacing.Admission) { c.admitted++ },
			Released:  func(pacing.Admission, time.Duration) { c.released++ },
		}
	}
	var before, after counts
	ctx := pacing.WithTrace(t.Context(), counting(&before))
	ctx = pacing.WithTrace(ctx, &pacing.Trace{Admitted: func(pacing.Admission) { panic("bug") }})
	ctx = pacing.WithTrace(ctx, counting(&after))
	assert.PanicsWithValue(t, "bug", func() { rt.RoundTrip(post(t, ctx, `{"model":"m"}`)) })
	assert.Zero(t, gate.Status().InFlight)
	assert.Zero(t, f.held.Load())
	assert.Equal(t, counts{admitted: 1, released: 1}, before, "told Admitted, then Released")
	assert.Equal(t, counts{}, after, "told neither")

	var first counts
	ctx = pacing.WithTrace(t.Context(), &pacing.Trace{FleetWait: func() func() { return func() { panic("its end") } }})
	ctx = pacing.WithTrace(ctx, counting(&first))
	ctx = pacing.WithTrace(ctx, &pacing.Trace{FleetWait: func() func() { panic("bug") }})
	assert.PanicsWithValue(t, "bug", func() { rt.RoundTrip(post(t, ctx, `{"model":"m"}`)) })
	assert.Zero(t, first.waiting, "the wait that began was ended")
	assert.Zero(t, f.held.Load())
}
