package pacing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// guarded is a spend that also tells whether two of its calls ever ran at
// once, or any came after its end.
type guarded struct {
	spend
	in      atomic.Int32
	overlap atomic.Bool
}

func (g *guarded) enter() func() {
	if g.in.Add(1) > 1 {
		g.overlap.Store(true)
	}
	return func() { g.in.Add(-1) }
}

func (g *guarded) Start(ctx context.Context) error { defer g.enter()(); return g.spend.Start(ctx) }
func (g *guarded) Settle(ctx context.Context, used pacing.Tokens) error {
	defer g.enter()()
	return g.spend.Settle(ctx, used)
}
func (g *guarded) Cancel(ctx context.Context) error {
	defer g.enter()()
	return g.spend.Cancel(ctx)
}

// panicking is a spend whose Start panics.
type panicking struct{ spend }

func (p *panicking) Start(ctx context.Context) error {
	_ = p.spend.Start(ctx)
	panic("the store's client")
}

func reserving(r pacing.FleetReservation) pacing.TransportOption {
	return pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		return r, nil
	})
}

// A credential function that panics sends nothing: what the request
// reserved is cancelled, as for any request never sent (it was left
// standing, started and never ended).
func TestFleetBudgetsCredentialPanicCancels(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	s := &spend{}
	rt := pacing.NewTransport(base, gate, reserving(s), pacing.WithCredential(func(http.Header, string) { panic("vault") }))
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 7}), `{"model":"m"}`))
	}()
	assert.Zero(t, sent())
	assert.Equal(t, []string{"start", "cancel"}, s.Calls(), "not sent: cancelled")
	assert.Zero(t, gate.Status().InFlight)
}

// A reserve (or a reservation's Start) that speaks HTTP to its budgets'
// service under the context it is given must not be taken for the
// request's own connection: the request that then fails to dial was never
// sent, so it charges nothing (the reservation is cancelled, the Gate's
// budget gets its estimate back). With the exchange's httptrace in that
// context, the store's GotConn made the failed dial look like net/http's
// retry of a request that may have been sent: the estimates stood.
func TestFleetBudgetsStoreOverHTTPIsNotTheRequestsConnection(t *testing.T) {
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	defer store.Close()
	storeClient := &http.Client{Transport: &http.Transport{}}
	defer storeClient.CloseIdleConnections()
	ask := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, store.URL, nil)
		if err != nil {
			return err
		}
		resp, err := storeClient.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	s := &spend{}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.Body.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	})
	rt := pacing.NewTransport(base, gate, pacing.WithCutLinger(0), pacing.WithFleetBudgets(func(ctx context.Context, _ string, _ pacing.Tokens) (pacing.FleetReservation, error) {
		if err := ask(ctx); err != nil {
			return nil, err
		}
		return s, nil
	}))
	_, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), `{"model":"m"}`))
	require.Error(t, err)
	assert.Equal(t, []string{"start", "cancel"}, s.Calls(), "never sent: cancelled")
	st := gate.Status()
	require.NotEmpty(t, st.Budgets)
	assert.Equal(t, 1000, st.Budgets[0].Left, "never sent: the Gate's budget charged nothing")
	assert.Zero(t, st.InFlight)
}

// A reserve that panics holds nothing: no slot, no reservation to end.
func TestFleetBudgetsReservePanicHoldsNothing(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	f := &fakeFleet{}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		panic("store client")
	}))
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	}()
	assert.Zero(t, sent())
	assert.Empty(t, f.acquired)
	assert.Zero(t, gate.Status().InFlight)
}

// Every way out of the admission after the reservation ends it once, with
// Cancel, after giving back what was held: the fleet's refusal, a panic in
// a FleetWait's end, a panic in Start, a panic in a Trace's Admitted.
func TestFleetBudgetsCancelledOnEveryFailedAdmission(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse error
		trace  *pacing.Trace
		start  bool // the reservation's Start panics
		panics bool
		calls  []string
	}{
		{name: "the fleet refuses", refuse: &slots.LimitError{Err: slots.ErrQueueFull, Key: "provider"}, calls: []string{"cancel"}},
		{name: "a FleetWait's end panics", trace: &pacing.Trace{FleetWait: func() func() { return func() { panic("metrics") } }}, panics: true, calls: []string{"cancel"}},
		{name: "Start panics", start: true, panics: true, calls: []string{"start", "cancel"}},
		{name: "Admitted panics", trace: &pacing.Trace{Admitted: func(pacing.Admission) { panic("metrics") }}, panics: true, calls: []string{"start", "cancel"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, sent := answering(200, usageAnswer)
			f := &fakeFleet{refuse: tc.refuse}
			gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
			var r pacing.FleetReservation
			var calls func() []string
			if tc.start {
				p := &panicking{}
				r, calls = p, p.Calls
			} else {
				s := &spend{}
				r, calls = s, s.Calls
			}
			rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), reserving(r))
			ctx := t.Context()
			if tc.trace != nil {
				ctx = pacing.WithTrace(ctx, tc.trace)
			}
			var refused []error
			ctx = pacing.WithTrace(ctx, &pacing.Trace{Refused: func(err error) { refused = append(refused, err) }})
			func() {
				defer func() {
					if p := recover(); !tc.panics {
						require.Nil(t, p)
					}
				}()
				_, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
				require.Error(t, err)
			}()
			assert.Zero(t, sent())
			assert.Equal(t, tc.calls, calls())
			assert.Zero(t, f.held.Load(), "fleet slot held")
			assert.Zero(t, gate.Status().InFlight, "gate slot held")
			if tc.refuse != nil {
				assert.Len(t, refused, 1)
			}
		})
	}
}

// A Start refusal of a request the Gate let go without a slot (on
// "proceed" after its longest wait) frees the fleet's slot, cancels the
// reservation and refuses it, with no double release of the bypass; the
// Trace hears the refusal alone, not Admitted, Released or Settled.
func TestFleetBudgetsStartRefusalOfABypass(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	f := &fakeFleet{}
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 5, OnWaitTimeout: pacing.Proceed})
	blocker, err := gate.Acquire(t.Context(), "m")
	require.NoError(t, err)
	s := &spend{startErr: &slots.LimitError{Err: pacing.ErrOverBudget, Key: "provider", Cap: pacing.CapTokensPerMinute}}
	rt := pacing.NewTransport(base, gate, pacing.WithFleet(f), reserving(s))
	var mu sync.Mutex
	var heard []string
	hear := func(s string) { mu.Lock(); heard = append(heard, s); mu.Unlock() }
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{
		Admitted: func(pacing.Admission) { hear("admitted") },
		Refused:  func(error) { hear("refused") },
		Settled:  func(pacing.Settlement) { hear("settled") },
		Released: func(pacing.Admission, time.Duration) { hear("released") },
	})
	_, err = rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, pacing.CapTokensPerMinute, le.Cap)
	assert.Zero(t, sent())
	assert.Equal(t, []string{"start", "cancel"}, s.Calls())
	mu.Lock()
	assert.Equal(t, []string{"refused"}, heard)
	mu.Unlock()
	assert.Zero(t, f.held.Load(), "fleet slot held")
	st := gate.Status()
	assert.Equal(t, uint64(1), st.Bypassed)
	assert.Zero(t, st.DoubleReleases)
	blocker.Slot.Release()
	assert.Zero(t, gate.Status().InFlight)
}

// A request refused at its Start with a Released hook and learned caps:
// the Trace hears no release, and nothing is left held.
func TestFleetBudgetsStartRefusalHearsNoRelease(t *testing.T) {
	base, _ := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 2, MinIntervalMS: 1000})
	s := &spend{startErr: &slots.LimitError{Err: pacing.ErrOverBudget, Key: "provider"}}
	rt := pacing.NewTransport(base, gate, reserving(s))
	var released atomic.Int32
	ctx := pacing.WithTrace(t.Context(), &pacing.Trace{Released: func(pacing.Admission, time.Duration) { released.Add(1) }})
	_, err := rt.RoundTrip(post(t, ctx, `{"model":"m"}`))
	require.Error(t, err)
	assert.Zero(t, released.Load())
	st := gate.Status()
	assert.Zero(t, st.InFlight)
	assert.True(t, st.LastStart.IsZero(), "its start is taken back: the next is not spaced after it")
	// The next one goes at once (no spacing after a start never made).
	s.startErr = nil
	resp, err := rt.RoundTrip(post(t, t.Context(), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Equal(t, []string{"start", "cancel", "start"}, s.Calls())
}

// The request's context ending after the admission (here during Start)
// sends nothing: the reservation is started, then cancelled, and the
// Gate's budget charged nothing.
func TestFleetBudgetsContextEndedAfterAdmission(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	ctx, cancel := context.WithCancel(t.Context())
	s := &startHook{f: cancel}
	rt := pacing.NewTransport(base, gate, reserving(s))
	_, err := rt.RoundTrip(post(t, pacing.WithTokens(ctx, pacing.Tokens{Input: 100}), `{"model":"m"}`))
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, sent())
	assert.Equal(t, []string{"start", "cancel"}, s.Calls())
	st := gate.Status()
	require.NotEmpty(t, st.Budgets)
	assert.Equal(t, 1000, st.Budgets[0].Left)
	assert.Zero(t, st.InFlight)

	// Ended before the reservation: nothing is reserved.
	n := 0
	rt = pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		n++
		return &spend{}, nil
	}))
	ended, end := context.WithCancel(context.Background())
	end()
	_, err = rt.RoundTrip(post(t, pacing.WithWaitContext(t.Context(), ended), `{"model":"m"}`))
	require.Error(t, err)
	assert.Zero(t, n, "a wait context ended already reserves nothing")
}

// startHook is a spend that calls f in its Start.
type startHook struct {
	spend
	f func()
}

func (s *startHook) Start(ctx context.Context) error { s.f(); return s.spend.Start(ctx) }

// A request under slots.WithoutSlot reserves nothing.
func TestFleetBudgetsWithoutSlotReservesNothing(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	n := 0
	rt := pacing.NewTransport(base, gate, pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
		n++
		return &spend{}, nil
	}))
	resp, err := rt.RoundTrip(post(t, slots.WithoutSlot(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 1})), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Equal(t, 1, sent())
	assert.Zero(t, n)
}

// How the answer ends the reservation: a 101 and a body closed before its
// usage leave the estimate; a redirect followed by an http.Client settles
// the redirect with nothing and the followed request with its usage, each
// its own reservation.
func TestFleetBudgetsAnswerEnds(t *testing.T) {
	t.Run("101", func(t *testing.T) {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Body.Close()
			return &http.Response{StatusCode: http.StatusSwitchingProtocols, Header: http.Header{"Upgrade": {"websocket"}},
				Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
		})
		s := &spend{}
		rt := pacing.NewTransport(base, tGate(t, pacing.Config{MaxConcurrentRequests: 1}), reserving(s))
		resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 1}), `{"model":"m"}`))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, []string{"start"}, s.Calls())
	})
	t.Run("closed early", func(t *testing.T) {
		base, _ := answering(200, usageAnswer)
		s := &spend{}
		rt := pacing.NewTransport(base, tGate(t, pacing.Config{MaxConcurrentRequests: 1}), reserving(s), pacing.WithCutLinger(0))
		resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 1}), `{"model":"m"}`))
		require.NoError(t, err)
		_, _ = resp.Body.Read(make([]byte, 5))
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, []string{"start"}, s.Calls(), "no usage seen: the estimate stands")
	})
	t.Run("redirect", func(t *testing.T) {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Body != nil {
				_, _ = io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
			if r.URL.Path == "/old" {
				return &http.Response{StatusCode: http.StatusTemporaryRedirect, Header: http.Header{"Location": {"/new"}},
					Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
			}
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(usageAnswer)), Request: r}, nil
		})
		var mu sync.Mutex
		var all []*spend
		rt := pacing.NewTransport(base, tGate(t, pacing.Config{MaxConcurrentRequests: 1}), pacing.WithFleetBudgets(func(context.Context, string, pacing.Tokens) (pacing.FleetReservation, error) {
			s := &spend{}
			mu.Lock()
			all = append(all, s)
			mu.Unlock()
			return s, nil
		}))
		ctx := pacing.WithTokens(pacing.WithModelName(t.Context(), "m"), pacing.Tokens{Input: 10})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.invalid/old", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		resp, err := (&http.Client{Transport: rt}).Do(req)
		require.NoError(t, err)
		done(t, resp)
		require.Len(t, all, 2)
		assert.Equal(t, []string{"start", "settle 0+0"}, all[0].Calls())
		assert.Equal(t, []string{"start", "settle 3+5"}, all[1].Calls())
	})
}

// An answer refused by the upstream, read on one goroutine while its
// context ends on another (the Transport's watch closes the body): the
// reservation is ended once, never by two calls at once. (Cancelled when
// the classifier saw the refusal's body; a 429 whose body was cut before
// it said anything is Other, and is settled with nothing as a client
// error: the Gate's rule, see ClassifyAsRead.)
func TestFleetBudgetsEndedOnceWhileReadAndCut(t *testing.T) {
	for i := range 20 {
		pr, pw := io.Pipe()
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Body.Close()
			return &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{"Content-Type": {"application/json"}},
				Body: pr, Request: r}, nil
		})
		g := &guarded{}
		rt := pacing.NewTransport(base, tGate(t, pacing.Config{MaxConcurrentRequests: 1}), reserving(g), pacing.WithCutLinger(0))
		ctx, cancel := context.WithCancel(t.Context())
		resp, err := rt.RoundTrip(post(t, pacing.WithTokens(ctx, pacing.Tokens{Input: 1}), `{"model":"m"}`))
		require.NoError(t, err)
		read := make(chan struct{})
		go func() {
			defer close(read)
			_, _ = io.Copy(io.Discard, resp.Body)
		}()
		go func() {
			_, _ = io.WriteString(pw, `{"error":{"message":"slow down"`)
			if i%2 == 0 {
				pw.Close()
			}
		}()
		cancel()
		<-read
		_ = resp.Body.Close()
		pw.Close()
		calls := g.Calls()
		require.Len(t, calls, 2, "round %d: %v", i, calls)
		assert.Equal(t, "start", calls[0])
		assert.Contains(t, []string{"cancel", "settle 0+0"}, calls[1])
		assert.False(t, g.overlap.Load())
	}
}

// A reservation without limits, or with some parts only, adds only the
// parts it limits to the rate-limit headers.
func TestFleetBudgetsRateLimitHeadersPartsWithoutLimits(t *testing.T) {
	base, _ := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	s := &spendLeft{}
	s.left, s.limits = [4]int{-5, 3, 0, 0}, [4]int{0, 0, 0, 0} // no limits: nothing to tell
	rt := pacing.NewTransport(base, gate, pacing.WithRateLimitHeaders(), reserving(s))
	resp, err := rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Equal(t, "1000", resp.Header.Get("X-Ratelimit-Limit-Tokens"), "the Gate's")
	assert.Empty(t, resp.Header.Get("X-Ratelimit-Limit-Requests"))

	s.left, s.limits = [4]int{0, 0, 0, -2}, [4]int{0, 0, 0, 5} // requests only, over
	resp, err = rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), `{"model":"m"}`))
	require.NoError(t, err)
	done(t, resp)
	assert.Equal(t, "1000", resp.Header.Get("X-Ratelimit-Limit-Tokens"))
	assert.Equal(t, "5", resp.Header.Get("X-Ratelimit-Limit-Requests"))
	assert.Equal(t, "0", resp.Header.Get("X-Ratelimit-Remaining-Requests"), "never below 0")
	assert.Empty(t, resp.Header.Get("X-Ratelimit-Reset-Requests"))
}

// A Start that panics sends nothing: as a Start refusal, the Gate's
// budget and spacing charge the request nothing (they kept its estimate
// and its start), and its reservation is cancelled.
func TestFleetBudgetsStartPanicChargesTheGateNothing(t *testing.T) {
	base, sent := answering(200, usageAnswer)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
	p := &panicking{}
	rt := pacing.NewTransport(base, gate, reserving(p))
	func() {
		defer func() { require.NotNil(t, recover()) }()
		_, _ = rt.RoundTrip(post(t, pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), `{"model":"m"}`))
	}()
	assert.Zero(t, sent())
	assert.Equal(t, []string{"start", "cancel"}, p.Calls())
	st := gate.Status()
	assert.Zero(t, st.InFlight)
	require.NotEmpty(t, st.Budgets)
	assert.Equal(t, 1000, st.Budgets[0].Left, "the Gate's budget charged nothing")
	assert.True(t, st.LastStart.IsZero(), "nor its spacing")
}

// A panic in an Admitted hook sends nothing either: the Gate's budget and
// spacing charge the request nothing, as for a Start that panics, with or
// without budgets kept outside the Gate. (Its estimate stood, and its
// start spaced the next, before.)
func TestAdmittedPanicChargesTheGateNothing(t *testing.T) {
	for _, outside := range []bool{false, true} {
		base, sent := answering(200, usageAnswer)
		gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1, BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 1000}})
		var opts []pacing.TransportOption
		r := &spend{}
		if outside {
			opts = append(opts, reserving(r))
		}
		rt := pacing.NewTransport(base, gate, opts...)
		ctx := pacing.WithTrace(pacing.WithTokens(t.Context(), pacing.Tokens{Input: 100}), &pacing.Trace{Admitted: func(pacing.Admission) { panic("metrics") }})
		assert.PanicsWithValue(t, "metrics", func() { _, _ = rt.RoundTrip(post(t, ctx, `{"model":"m"}`)) })
		assert.Zero(t, sent())
		st := gate.Status()
		assert.Zero(t, st.InFlight)
		require.NotEmpty(t, st.Budgets)
		assert.Equal(t, 1000, st.Budgets[0].Left, "outside %v: the Gate's budget charged nothing", outside)
		assert.True(t, st.LastStart.IsZero(), "outside %v: nor its spacing", outside)
		if outside {
			assert.Equal(t, []string{"start", "cancel"}, r.Calls())
		}
	}
}
