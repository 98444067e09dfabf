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
	"testing/synctest"
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

// recoveredLogs returns a logger for WithLogger and what it logs, and
// sets slog's default logger for the rest of the test to one whose records
// the test's end checks: a panic recovered on a goroutine of the
// library's own is logged to its slot's logger, and never to the default.
func recoveredLogs(t *testing.T) (*slog.Logger, *testrig.Buffer) {
	var logged, elsewhere testrig.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&elsewhere, nil)))
	t.Cleanup(func() {
		slog.SetDefault(old)
		assert.NotContains(t, elsewhere.String(), "recovered", "logged to slog's default logger")
	})
	return slog.New(slog.NewTextHandler(&logged, nil)), &logged
}

// A body whose Close panics when the request's context ends, closed by the
// Transport's watch on a goroutine of its own, frees its slot and is
// logged there, to the slot's logger: the panic has no caller to go up
// to, and would end the process.
func TestBodyThatPanicsClosedByTheWatch(t *testing.T) {
	logger, logged := recoveredLogs(t)
	lim := slots.NewLimiter(1, slots.WithLogger(logger))
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
// dropped Slot) is logged to the slot's logger, not the end of the
// process; the slot is freed.
func TestObserverPanicOffTheCallersGoroutine(t *testing.T) {
	logger, logged := recoveredLogs(t)
	panicky := slots.WithObserver(slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased || e.Kind == slots.EventLeaked {
			panic("an observer's bug")
		}
	}))
	t.Run("a linger's timer", func(t *testing.T) {
		lim := slots.NewLimiter(1, panicky, slots.WithLogger(logger))
		tr := slots.NewTransport(answering(io.NopCloser(strings.NewReader("data"))), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
			slots.WithLinger(time.Millisecond))
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close()) // closed before its end: a cut, freed after the linger
		require.Eventually(t, func() bool { return lim.InFlight() == 0 }, 10*time.Second, time.Millisecond)
	})
	t.Run("a slow Close's timer", func(t *testing.T) {
		lim := slots.NewLimiter(1, panicky, slots.WithLogger(logger))
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
		lim := slots.NewLimiter(1, panicky, slots.WithLeakDetection(), slots.WithLogger(logger))
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

// A logger that panics on the warning of a leak (a handler's bug) does
// not keep the dropped Slot's capacity, nor end the process when the
// panic, recovered, is logged to it again.
func TestLoggerThatPanicsOnAReclaim(t *testing.T) {
	lim := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithLogger(slog.New(panickyHandler{})))
	func() {
		_, err := lim.TryAcquire()
		require.NoError(t, err)
	}()
	require.Eventually(t, func() bool { runtime.GC(); return lim.InFlight() == 0 }, 10*time.Second, time.Millisecond, "the slot reclaimed")
	assert.Equal(t, uint64(1), lim.Stats().Leaked)
}

// panickyHandler is a slog.Handler that panics on every record.
type panickyHandler struct{}

func (panickyHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (panickyHandler) Handle(context.Context, slog.Record) error { panic("a handler's bug") }
func (h panickyHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panickyHandler) WithGroup(string) slog.Handler           { return h }

// A request the admit function let go without a slot (nil) and whose
// exchange was cut arms no linger: there is nothing to free, and a timer
// that went looking for the slot's logger would find none. In a bubble,
// so that the linger's time passes.
func TestTransportLingerWithoutASlot(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, errors.New("connection reset by peer")
		}), func(*http.Request) (*slots.Slot, error) { return nil, nil }, slots.WithLinger(time.Millisecond))
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		require.ErrorContains(t, err, "connection reset")
		time.Sleep(time.Second) // virtual: past the linger, whose timer would run now
		synctest.Wait()
	})
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
// logged to the first part's logger. (The second part stayed held.)
func TestCombinedSlotPartPanicsOnRelease(t *testing.T) {
	panicky := slots.WithObserver(slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased {
			panic("an observer's bug")
		}
	}))
	both := func(t *testing.T, opts ...slots.Option) (a, b *slots.Limiter, admit func(*http.Request) (*slots.Slot, error)) {
		a, b = slots.NewLimiter(1, append(opts, panicky)...), slots.NewLimiter(1)
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
		logger, logged := recoveredLogs(t)
		a, b, admit := both(t, slots.WithLogger(logger))
		tr := slots.NewTransport(answering(io.NopCloser(strings.NewReader("data"))), admit, slots.WithLinger(time.Millisecond))
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close()) // a cut: freed after the linger
		require.Eventually(t, func() bool { return strings.Contains(logged.String(), "an observer's bug") }, 10*time.Second, time.Millisecond)
		assert.Equal(t, 0, a.InFlight())
		assert.Equal(t, 0, b.InFlight(), "the second part")
	})
}
