package slots_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// openBase answers at once with a body nobody reads, and counts the
// exchanges whose context has not ended: the upstream's view.
type openBase struct{ open atomic.Int64 }

func (b *openBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.open.Add(1)
	context.AfterFunc(r.Context(), func() { b.open.Add(-1) })
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, ContentLength: -1,
		Body: io.NopCloser(strings.NewReader("streaming")), Request: r}, nil
}

// reqBody is a request body whose Close the reclaim calls: it tells it was
// called, may wait for unblock, and may panic.
type reqBody struct {
	closed  chan struct{}
	unblock chan struct{} // nil: no wait
	panics  bool
	once    sync.Once
}

func newReqBody() *reqBody { return &reqBody{closed: make(chan struct{})} }

func (b *reqBody) Read([]byte) (int, error) { return 0, io.EOF }

func (b *reqBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	if b.unblock != nil {
		<-b.unblock
	}
	if b.panics {
		panic("a request body's Close bug")
	}
	return nil
}

func (b *reqBody) isClosed() bool {
	select {
	case <-b.closed:
		return true
	default:
		return false
	}
}

// dropResponse sends a request through tr with body and drops the
// response, neither read nor closed, and waits for the reclaim to close
// the request body.
func dropResponse(t *testing.T, tr http.RoundTripper, body *reqBody) {
	t.Helper()
	func() {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://upstream.invalid/v1", body)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		_ = resp // dropped
	}()
	require.Eventually(t, func() bool { runtime.GC(); return body.isClosed() }, 10*time.Second, time.Millisecond,
		"the reclaim closes the request body")
}

func leakLimiter(opts ...slots.Option) *slots.Limiter {
	return slots.NewLimiter(1, append([]slots.Option{slots.WithLeakDetection(), slots.WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
}

// The exchange's end, as the upstream sees it (the reclaim's abort), comes
// before the reclaim sets its linger's timer (once the request body's Close
// has returned): a test that advances a mock clock once the upstream has
// seen the end may advance it before the timer exists, and then the timer
// never fires. TestTransportLeakedStreamLingers did so (a narrow window
// there: the reclaim's goroutine preempted between abort and the timer);
// it now waits for the timer to be set. Here the window is held open by a
// Close that waits.
func TestReclaimLingerBeginsAfterTheCut(t *testing.T) {
	mock := testrig.NewSettingClock()
	base := &openBase{}
	lim := leakLimiter()
	tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
		slots.WithLinger(time.Second), slots.WithClock(mock))
	body := newReqBody()
	body.unblock = make(chan struct{})
	dropResponse(t, tr, body)
	require.Eventually(t, func() bool { return base.open.Load() == 0 }, 10*time.Second, time.Millisecond,
		"the reclaim ends the exchange")
	select {
	case <-mock.Set():
		require.FailNow(t, "the timer was set while the body's Close had not returned")
	default: // the upstream has seen the end; the linger has not begun
	}
	mock.Add(time.Second) // what TestTransportLeakedStreamLingers did at this point
	close(body.unblock)
	mock.WaitSet(t, 1, time.Second)
	assert.Equal(t, 1, lim.InFlight(), "the linger counts from the end of the cut")
	mock.Add(time.Second)
	require.Eventually(t, func() bool { return lim.InFlight() == 0 && lim.Stats().Leaked == 1 }, 10*time.Second, time.Millisecond)
}

// A request body whose Close panics in the reclaim: the panic is logged, not
// the end of the process, and the slot is freed all the same, after the
// linger (or at once without one), and counted as leaked once.
func TestReclaimBodyClosePanics(t *testing.T) {
	for _, linger := range []time.Duration{0, time.Second} {
		t.Run(linger.String(), func(t *testing.T) {
			mock := testrig.NewSettingClock()
			var logs testrig.Buffer
			lim := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			tr := slots.NewTransport(&openBase{}, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
				slots.WithLinger(linger), slots.WithClock(mock))
			body := newReqBody()
			body.panics = true
			dropResponse(t, tr, body)
			if linger == 0 {
				require.Eventually(t, func() bool { return lim.InFlight() == 0 && lim.Stats().Leaked == 1 }, 10*time.Second, time.Millisecond,
					"freed at once")
				require.Eventually(t, func() bool { return strings.Contains(logs.String(), "a request body's Close bug") }, 10*time.Second, time.Millisecond)
				return
			}
			mock.WaitSet(t, 1, time.Second)
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "a request body's Close bug") }, 10*time.Second, time.Millisecond,
				"the panic is logged")
			assert.Equal(t, 1, lim.InFlight(), "kept for the linger")
			assert.Zero(t, lim.Stats().Leaked)
			t.Logf("logged while the slot is still held: %s", logs.String())
			mock.Add(linger)
			require.Eventually(t, func() bool { return lim.InFlight() == 0 && lim.Stats().Leaked == 1 }, 10*time.Second, time.Millisecond,
				"freed after the linger")
		})
	}
}

// An Observer that panics when told of the release inside the linger's
// timer does not end the process, and the slot is freed and counted.
func TestReclaimLingerObserverPanics(t *testing.T) {
	mock := testrig.NewSettingClock()
	var told atomic.Int32
	lim := leakLimiter(slots.WithObserver(slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased || e.Kind == slots.EventLeaked {
			told.Add(1)
			panic("an Observer's bug")
		}
	})))
	tr := slots.NewTransport(&openBase{}, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
		slots.WithLinger(time.Second), slots.WithClock(mock))
	dropResponse(t, tr, newReqBody())
	mock.WaitSet(t, 1, time.Second)
	assert.Equal(t, 1, lim.InFlight())
	mock.Add(time.Second)
	require.Eventually(t, func() bool { return lim.InFlight() == 0 && lim.Stats().Leaked == 1 && told.Load() >= 1 }, 10*time.Second, time.Millisecond)
}

// A combined slot's parts are each kept for the linger and freed after it,
// each reported once.
func TestReclaimLingerCombined(t *testing.T) {
	mock := testrig.NewSettingClock()
	a, b := leakLimiter(), leakLimiter()
	tr := slots.NewTransport(&openBase{}, func(r *http.Request) (*slots.Slot, error) {
		s1, err := a.Acquire(r.Context())
		require.NoError(t, err)
		s2, err := b.Acquire(r.Context())
		require.NoError(t, err)
		return slots.Combine(s1, s2), nil
	}, slots.WithLinger(time.Second), slots.WithClock(mock))
	dropResponse(t, tr, newReqBody())
	mock.WaitSet(t, 2, time.Second)
	assert.Equal(t, []int{1, 1}, []int{a.InFlight(), b.InFlight()}, "both parts kept for the linger")
	mock.Add(time.Second)
	require.Eventually(t, func() bool {
		return a.InFlight() == 0 && b.InFlight() == 0 && a.Stats().Leaked == 1 && b.Stats().Leaked == 1
	}, 10*time.Second, time.Millisecond)
}

// closeBody is a response body that tells when it is closed.
type closeBody struct {
	io.Reader
	closed chan struct{}
	once   sync.Once
}

func (b *closeBody) Close() error { b.once.Do(func() { close(b.closed) }); return nil }

// A dropped response whose request's context ends meanwhile: the watch
// (which holds the body weakly) and the reclaim may both come; the slot is
// freed once, after the linger, whichever frees it.
func TestReclaimRacesContextEnd(t *testing.T) {
	var byWatch, byReclaim int
	defer func() { t.Logf("freed by the watch %d times, by the reclaim %d", byWatch, byReclaim) }()
	for range 20 {
		mock := testrig.NewSettingClock()
		lim := leakLimiter()
		respClosed := make(chan struct{})
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, ContentLength: -1, Request: r,
				Body: &closeBody{Reader: strings.NewReader("streaming"), closed: respClosed}}, nil
		})
		tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
			slots.WithLinger(time.Second), slots.WithClock(mock))
		ctx, cancel := context.WithCancel(context.Background())
		body := newReqBody()
		func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.invalid/v1", body)
			require.NoError(t, err)
			resp, err := tr.RoundTrip(req)
			require.NoError(t, err)
			_ = resp // dropped
		}()
		go cancel()
		require.Eventually(t, func() bool {
			runtime.GC()
			select {
			case <-respClosed:
				return true // the watch cut it
			default:
				return body.isClosed() // the reclaim did
			}
		}, 10*time.Second, time.Millisecond)
		mock.WaitSet(t, 1, time.Second)
		assert.Equal(t, 1, lim.InFlight(), "kept for the linger")
		mock.Add(time.Second)
		require.Eventually(t, func() bool { return lim.InFlight() == 0 }, 10*time.Second, time.Millisecond)
		st := lim.Stats()
		if st.Leaked == 1 {
			byReclaim++
		} else {
			byWatch++
		}
		assert.Zero(t, st.DoubleReleases)
		assert.LessOrEqual(t, st.Leaked, uint64(1))
	}
}
