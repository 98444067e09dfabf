package inflightotel_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// A request that its API key's budget refuses is counted as over_budget
// (as inflightprom names it), not as "other", and so is its span.
func TestOverBudgetResult(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") }))
	defer up.Close()
	gate, err := pacing.NewGate("p", pacing.Config{
		APIKeys: []pacing.KeyConfig{{ID: "k", BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}}},
	})
	require.NoError(t, err)
	defer gate.Close()
	rt := pacing.NewTransport(up.Client().Transport, gate)
	m := newMeters(t)
	c, err := inflightotel.New("provider", inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	sr, tp := tracing(t)
	send := func() error {
		ctx, span := tp.Tracer("t").Start(context.Background(), "request")
		defer span.End()
		ctx = pacing.WithTrace(ctx, c.Trace(ctx))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		resp, err := rt.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	require.NoError(t, send())
	require.ErrorIs(t, send(), pacing.ErrOverBudget)
	got := ints(t, m.collect(t)["inflight.requests"])
	assert.Equal(t, int64(1), got["inflight.cap=provider,inflight.priority=default,inflight.result=over_budget"], "%v", got)
	var results []string
	for _, s := range sr.Ended() {
		if s.Name() == "acquire provider" {
			results = append(results, attrMap(s.Attributes())["inflight.result"])
		}
	}
	assert.Equal(t, []string{"acquired", "over_budget"}, results)
}

// A weight the limit can never hold is counted as exceeds_limit (as
// inflightprom names it), not as "other".
func TestExceedsLimitResult(t *testing.T) {
	m := newMeters(t)
	c, err := inflightotel.New("l", inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	l := slots.NewLimiter(2, slots.WithObserver(c))
	_, err = l.AcquireN(context.Background(), 3)
	require.ErrorIs(t, err, slots.ErrExceedsLimit)
	got := ints(t, m.collect(t)["inflight.requests"])
	assert.Equal(t, int64(1), got["inflight.cap=l,inflight.priority=default,inflight.result=exceeds_limit"], "%v", got)
}

// Without an SDK and without a span, a Cap's Trace is nil: attached to
// each request it costs nothing (a Trace with a Released hook makes a
// pacing.Transport build what that hook is told).
func TestTraceCostsNothingWithoutSpanOrSDK(t *testing.T) {
	c, err := inflightotel.New("provider")
	require.NoError(t, err)
	assert.Nil(t, c.Trace(context.Background()))
	gate, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 4})
	require.NoError(t, err)
	defer gate.Close()
	ok := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("{}")), Header: http.Header{}, Request: r}, nil
	})
	rt := pacing.NewTransport(ok, gate)
	run := func(withTrace bool) float64 {
		return testing.AllocsPerRun(200, func() {
			ctx := context.Background()
			if withTrace {
				ctx = pacing.WithTrace(ctx, c.Trace(ctx))
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream/", strings.NewReader(`{"model":"m"}`))
			resp, err := rt.RoundTrip(req)
			if err != nil {
				panic(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	bare, traced := run(false), run(true)
	t.Logf("allocations per request: %v bare, %v with the Cap's Trace", bare, traced)
	assert.Equal(t, bare, traced)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The results and misuse the tests above do not reach: a fail-open
// admission (bypassed), a caller whose context ends while it waits
// (canceled), an error of no kind the adapter knows (other, named on no
// attribute but the result), and a Slot reclaimed by leak detection
// (leaked). In virtual time.
func TestEveryResultCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMeters(t)
		c, err := inflightotel.New("l", inflightotel.WithMeterProvider(m))
		require.NoError(t, err)
		l := slots.NewLimiter(1, slots.WithObserver(c), slots.WithMaxWait(time.Second), slots.WithFailOpen())
		held, err := l.TryAcquire()
		require.NoError(t, err)
		bypass, err := l.Acquire(context.Background()) // waits its second, then goes ahead without a slot
		require.NoError(t, err)
		assert.True(t, bypass.Bypassed(), "fail-open: no slot")
		bypass.Release()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err = l.Acquire(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		held.Release()
		c.Observe(slots.Event{Kind: slots.EventRejected, Err: errors.New("a store's own failure")})
		c.Observe(slots.Event{Kind: slots.EventLeaked, Hold: time.Second, Units: 1})

		got := m.collect(t)
		assert.Equal(t, map[string]int64{
			"inflight.cap=l,inflight.result=acquired":                           1,
			"inflight.cap=l,inflight.priority=default,inflight.result=bypassed": 1,
			"inflight.cap=l,inflight.priority=default,inflight.result=canceled": 1,
			"inflight.cap=l,inflight.result=other":                              1,
		}, ints(t, got["inflight.requests"]))
		assert.Equal(t, map[string]int64{"inflight.cap=l,inflight.misuse=leaked": 1}, ints(t, got["inflight.slot.misuses"]))
	})
}
