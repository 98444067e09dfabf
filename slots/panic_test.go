package slots_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// panickyBody panics in the method named by in.
type panickyBody struct{ in string }

func (b panickyBody) Read([]byte) (int, error) {
	if b.in == "Read" {
		panic("body bug in Read")
	}
	return 0, nil
}

func (b panickyBody) WriteTo(io.Writer) (int64, error) {
	if b.in == "WriteTo" {
		panic("body bug in WriteTo")
	}
	return 0, nil
}

func (b panickyBody) Close() error {
	if b.in == "Close" {
		panic("body bug in Close")
	}
	return nil
}

// TestBodiesThatPanic: a body whose Read, WriteTo or Close panics gives
// its slot back, and the panic goes on up unchanged.
func TestBodiesThatPanic(t *testing.T) {
	use := map[string]func(io.ReadCloser){
		"Read":    func(b io.ReadCloser) { _, _ = b.Read(make([]byte, 8)) },
		"WriteTo": func(b io.ReadCloser) { _, _ = b.(io.WriterTo).WriteTo(io.Discard) },
		"Close":   func(b io.ReadCloser) { _ = b.Close() },
	}
	for _, method := range []string{"Read", "WriteTo", "Close"} {
		t.Run("WrapBody, in "+method, func(t *testing.T) {
			lim := slots.NewLimiter(1)
			s, err := lim.TryAcquire()
			require.NoError(t, err)
			b := slots.WrapBody(panickyBody{method}, s)
			assert.PanicsWithValue(t, "body bug in "+method, func() { use[method](b) })
			assert.Equal(t, 0, lim.InFlight())
		})
		t.Run("a Transport's body, in "+method, func(t *testing.T) {
			lim := slots.NewLimiter(1)
			tr := slots.NewTransport(answering(panickyBody{method}), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx))
			require.NoError(t, err)
			assert.PanicsWithValue(t, "body bug in "+method, func() { use[method](resp.Body) })
			assert.Equal(t, 0, lim.InFlight())
		})
	}
	t.Run("a Transport's response that comes with an error, in Close", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Body: panickyBody{"Close"}}, errors.New("broken")
		}), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		assert.PanicsWithValue(t, "body bug in Close", func() {
			_, _ = tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		})
		assert.Equal(t, 0, lim.InFlight())
	})
}

// closeCountingBody panics in Read and WriteTo, and counts its Closes,
// noting whether its slot was still held at the first.
type closeCountingBody struct {
	lim         *slots.Limiter
	closes      int
	heldAtFirst bool
}

func (b *closeCountingBody) Read([]byte) (int, error)         { panic("a wrapper's bug") }
func (b *closeCountingBody) WriteTo(io.Writer) (int64, error) { panic("a wrapper's bug") }
func (b *closeCountingBody) Close() error {
	b.closes++
	if b.closes == 1 {
		b.heldAtFirst = b.lim.InFlight() == 1
	}
	return nil
}

// A body whose Read or WriteTo panics (a wrapper's, on the way) is closed
// before its slot goes, once, as a broken exchange is: its connection does
// not stay open after the slot is free, and a later Close does nothing.
func TestBodyThatPanicsIsClosedFirst(t *testing.T) {
	use := map[string]func(io.ReadCloser){
		"Read":    func(b io.ReadCloser) { _, _ = b.Read(make([]byte, 8)) },
		"WriteTo": func(b io.ReadCloser) { _, _ = b.(io.WriterTo).WriteTo(io.Discard) },
	}
	for _, method := range []string{"Read", "WriteTo"} {
		for _, via := range []string{"WrapBody", "Transport"} {
			t.Run(via+", in "+method, func(t *testing.T) {
				lim := slots.NewLimiter(1)
				body := &closeCountingBody{lim: lim}
				var b io.ReadCloser
				if via == "WrapBody" {
					s, err := lim.TryAcquire()
					require.NoError(t, err)
					b = slots.WrapBody(body, s)
				} else {
					tr := slots.NewTransport(answering(body), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
					resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
					require.NoError(t, err)
					b = resp.Body
				}
				assert.PanicsWithValue(t, "a wrapper's bug", func() { use[method](b) })
				assert.Equal(t, 0, lim.InFlight())
				assert.Equal(t, 1, body.closes, "closed by the panic")
				assert.True(t, body.heldAtFirst, "closed before the slot went")
				require.NoError(t, b.Close())
				assert.Equal(t, 1, body.closes, "a later Close does nothing")
			})
		}
	}
}

// A body whose Close panics when the request's context ends, closed by the
// Transport's watch on a goroutine of its own, frees its slot and is
// logged there: the panic has no caller to go up to, and would end the
// process.
func TestBodyThatPanicsClosedByTheWatch(t *testing.T) {
	var logged testrig.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	lim := slots.NewLimiter(1)
	tr := slots.NewTransport(answering(panickyBody{"Close"}), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx))
	require.NoError(t, err)
	cancel() // the client walks away without reading or closing
	require.Eventually(t, func() bool { return lim.InFlight() == 0 }, 10*time.Second, time.Millisecond, "the slot freed")
	require.Eventually(t, func() bool { return strings.Contains(logged.String(), "body bug in Close") }, 10*time.Second, time.Millisecond)
	t.Log(logged.String())
	assert.NoError(t, resp.Body.Close(), "closed once, by the watch")
}

// An Observer that panics on a release the library makes on a goroutine
// of its own (a linger's timer, a slow Close's timer, the reclaim of a
// dropped Slot) is logged, not the end of the process; the slot is freed.
func TestObserverPanicOffTheCallersGoroutine(t *testing.T) {
	var logged testrig.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	panicky := slots.WithObserver(slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased || e.Kind == slots.EventLeaked {
			panic("an observer's bug")
		}
	}))
	t.Run("a linger's timer", func(t *testing.T) {
		lim := slots.NewLimiter(1, panicky)
		tr := slots.NewTransport(answering(io.NopCloser(strings.NewReader("data"))), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
			slots.WithLinger(time.Millisecond))
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close()) // closed before its end: a cut, freed after the linger
		require.Eventually(t, func() bool { return lim.InFlight() == 0 }, 10*time.Second, time.Millisecond)
	})
	t.Run("a slow Close's timer", func(t *testing.T) {
		lim := slots.NewLimiter(1, panicky)
		mock := clock.NewMock()
		closing, done := make(chan struct{}), make(chan struct{})
		body := &blockingClose{entered: closing, release: done}
		tr := slots.NewTransport(answering(body), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
			slots.WithClock(mock))
		ctx, cancel := context.WithCancel(context.Background())
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx))
		require.NoError(t, err)
		cancel() // the watch closes the body, whose Close hangs
		<-closing
		require.Eventually(t, func() bool { mock.Add(time.Second); return lim.InFlight() == 0 }, 10*time.Second, time.Millisecond)
		close(done)
	})
	t.Run("a dropped Slot reclaimed", func(t *testing.T) {
		lim := slots.NewLimiter(1, panicky, slots.WithLeakDetection())
		func() {
			_, err := lim.TryAcquire()
			require.NoError(t, err)
		}()
		require.Eventually(t, func() bool { runtime.GC(); return lim.InFlight() == 0 }, 10*time.Second, time.Millisecond)
		require.Eventually(t, func() bool { return lim.Stats().Leaked == 1 }, 10*time.Second, time.Millisecond, "the leak counted, the Observer's panic on its release notwithstanding")
	})
	require.Eventually(t, func() bool { return strings.Count(logged.String(), "an observer's bug") >= 3 }, 10*time.Second, time.Millisecond)
	t.Log(logged.String())
}

// blockingClose is a body whose Close waits for release, telling entered.
type blockingClose struct {
	entered, release chan struct{}
	once             sync.Once
}

func (b *blockingClose) Read([]byte) (int, error) { return 0, io.EOF }
func (b *blockingClose) Close() error {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	return nil
}

// A combined Slot whose first part's Observer panics when told of its
// release frees its other parts all the same: on the caller's goroutine,
// where the panic then goes up, and on a linger's timer, where it is
// logged. (The second part stayed held.)
func TestCombinedSlotPartPanicsOnRelease(t *testing.T) {
	panicky := slots.WithObserver(slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased {
			panic("an observer's bug")
		}
	}))
	both := func(t *testing.T) (a, b *slots.Limiter, admit func(*http.Request) (*slots.Slot, error)) {
		a, b = slots.NewLimiter(1, panicky), slots.NewLimiter(1)
		return a, b, func(r *http.Request) (*slots.Slot, error) {
			sa, err := a.TryAcquire()
			require.NoError(t, err)
			sb, err := b.TryAcquire()
			require.NoError(t, err)
			return slots.Combine(sa, sb), nil
		}
	}
	t.Run("released by its caller", func(t *testing.T) {
		a, b, admit := both(t)
		s, err := admit(nil)
		require.NoError(t, err)
		assert.PanicsWithValue(t, "an observer's bug", func() { s.Release() })
		assert.Equal(t, 0, a.InFlight())
		assert.Equal(t, 0, b.InFlight(), "the second part")
	})
	t.Run("on a linger's timer", func(t *testing.T) {
		var logged testrig.Buffer
		old := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
		t.Cleanup(func() { slog.SetDefault(old) })
		a, b, admit := both(t)
		tr := slots.NewTransport(answering(io.NopCloser(strings.NewReader("data"))), admit, slots.WithLinger(time.Millisecond))
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close()) // a cut: freed after the linger
		require.Eventually(t, func() bool { return strings.Contains(logged.String(), "an observer's bug") }, 10*time.Second, time.Millisecond)
		assert.Equal(t, 0, a.InFlight())
		assert.Equal(t, 0, b.InFlight(), "the second part")
	})
}
