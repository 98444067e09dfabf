package slots_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// A stream dropped while its slot is held, neither read nor closed (the
// caller's bug that leak detection is for), is closed when its slot is
// reclaimed, before the slot goes: the upstream's exchange ends, where it
// went on streaming (and counting against the upstream's cap) while the
// capacity was handed to the next request. Under a context that can end
// (the watch holds the body weakly) and one that cannot (no watch); and a
// combined slot's, whose every part is tracked. Over HTTP/1.1 and HTTP/2,
// whose client keeps the response it returned while the stream is open
// (before, an HTTP/2 stream's dropped Slot stayed reachable from it, and
// was never reclaimed).
func TestTransportLeakedStreamIsClosed(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2], func(t *testing.T) { leakedStreamIsClosed(t, h2) })
	}
}

func leakedStreamIsClosed(t *testing.T, h2 bool) {
	for _, tc := range []struct {
		name     string
		ctx      func(t *testing.T) context.Context
		combined bool
	}{
		{"a context that can end", func(t *testing.T) context.Context { return t.Context() }, false},
		{"a context that cannot end", func(*testing.T) context.Context { return context.Background() }, false},
		{"a combined slot", func(t *testing.T) context.Context { return t.Context() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var open, came atomic.Int64
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				came.Add(1)
				open.Add(1)
				defer open.Add(-1)
				streamUntilGone(r, w, w.(http.Flusher).Flush)
			}))
			base := startTLS(t, up, h2)
			quiet := slots.WithLogger(slog.New(slog.DiscardHandler))
			a, b := slots.NewLimiter(1, slots.WithLeakDetection(), quiet), slots.NewLimiter(1, slots.WithLeakDetection(), quiet)
			admit := func(r *http.Request) (*slots.Slot, error) {
				s, err := a.Acquire(r.Context())
				if err != nil || !tc.combined {
					return s, err
				}
				s2, err := b.Acquire(r.Context())
				require.NoError(t, err)
				return slots.Combine(s, s2), nil
			}
			client := &http.Client{Transport: slots.NewTransport(base, admit)}
			func() {
				req, err := http.NewRequestWithContext(tc.ctx(t), http.MethodGet, up.URL, nil)
				require.NoError(t, err)
				resp, err := client.Do(req)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, map[bool]int{false: 1, true: 2}[h2], resp.ProtoMajor)
				_ = resp // dropped: neither read nor closed
			}()
			require.Eventually(t, func() bool { return came.Load() == 1 }, 10*time.Second, time.Millisecond)
			require.Eventually(t, func() bool {
				runtime.GC()
				return a.Stats().Leaked == 1 && a.InFlight() == 0 && b.InFlight() == 0
			}, 10*time.Second, time.Millisecond, "reclaimed")
			require.Eventually(t, func() bool { return open.Load() == 0 }, 10*time.Second, time.Millisecond,
				"the dropped exchange goes on at the upstream after its slot was reclaimed")
			assert.Equal(t, 0, a.InFlight())
		})
	}
}

// streamUntilGone writes an event to w, flushed, every 5 ms until r's
// context ends or a write fails: a stream that never ends by itself.
func streamUntilGone(r *http.Request, w io.Writer, flush func()) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := w.Write([]byte("data: more\n\n")); err != nil {
			return
		}
		flush()
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// startTLS starts up over TLS, with HTTP/2 if h2, and returns a client
// transport for it. Both end with t; an open stream is cut first.
func startTLS(t *testing.T, up *httptest.Server, h2 bool) *http.Transport {
	up.EnableHTTP2 = h2
	up.StartTLS()
	t.Cleanup(up.Close)
	t.Cleanup(up.CloseClientConnections) // first: a stream left open ends
	base := up.Client().Transport.(*http.Transport)
	t.Cleanup(base.CloseIdleConnections)
	return base
}

// opaqueContext hides the cancellable context inside it, as a context of
// another library's may: a context made from it waits for its end on a
// goroutine of its own until it is cancelled itself.
type opaqueContext struct{ context.Context }

func (opaqueContext) Value(any) any { return nil }

// With leak detection, the context of the Transport's own under which an
// exchange goes out is cancelled once the exchange is over, also for an
// upgraded connection, which net/http watches no longer: before, each
// upgrade under a long-lived context left a context (here, a goroutine)
// behind it until that context ended. And the response's Request is the
// one the Transport was given, whose context is still the caller's.
func TestTransportLeakDetectionLeavesNoContextBehind(t *testing.T) {
	up, _, _ := echoing(t)
	lim := slots.NewLimiter(1, slots.WithLeakDetection())
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	rt := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := opaqueContext{parent}
	before := goleak.IgnoreCurrent()
	for range 5 {
		req := upgradeRequest(t, ctx, up.URL, "echo")
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
		assert.Same(t, req, resp.Request)
		conn := resp.Body.(io.ReadWriteCloser)
		_, err = conn.Write([]byte("ping"))
		require.NoError(t, err)
		got := make([]byte, 4)
		_, err = io.ReadFull(conn, got)
		require.NoError(t, err)
		assert.Equal(t, "ping", string(got), "the connection works, its context's end notwithstanding")
		require.NoError(t, conn.Close())
	}
	base.CloseIdleConnections()
	goleak.VerifyNone(t, before)
	assert.Equal(t, 0, lim.InFlight())

	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("done")) }))
	t.Cleanup(plain.Close)
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		req, err := http.NewRequestWithContext(ctx, method, plain.URL, nil)
		require.NoError(t, err)
		resp, err := rt.RoundTrip(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Same(t, req, resp.Request, method)
		assert.NoError(t, resp.Request.Context().Err(), method)
	}
}

// With leak detection the Transport hands out a copy of the base's
// response; the copy still has the answer's trailers once its body has been
// read to its end, declared ones and ones sent without notice, over
// HTTP/1.1 and HTTP/2. Through httputil.ReverseProxy (which copies them to
// its client after the body) its client gets what it gets with the base
// alone (over HTTP/2, net/http's proxy forwards none here, with or without
// the Transport).
func TestTransportLeakDetectionKeepsTrailers(t *testing.T) {
	for _, tc := range []struct {
		h2, declared bool
	}{{false, true}, {false, false}, {true, true}, {true, false}} {
		h2 := tc.h2
		name := map[bool]string{false: "HTTP/1.1", true: "HTTP/2"}[h2] + map[bool]string{false: ", none declared", true: ", one declared"}[tc.declared]
		t.Run(name, func(t *testing.T) {
			up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tc.declared {
					w.Header().Set("Trailer", "X-Declared")
				}
				_, _ = io.WriteString(w, "data: done\n\n")
				w.(http.Flusher).Flush() // chunked: a length known up front leaves no room for trailers
				w.Header().Set("X-Declared", "told")
				w.Header().Set(http.TrailerPrefix+"X-Unannounced", "late")
			}))
			base := startTLS(t, up, h2)
			lim := slots.NewLimiter(1, slots.WithLeakDetection())
			rt := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			trailers := func(t *testing.T, resp *http.Response, err error) http.Header {
				t.Helper()
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				assert.Equal(t, "data: done\n\n", string(body))
				assert.Equal(t, 0, lim.InFlight())
				return resp.Trailer
			}

			req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, up.URL, nil)
			require.NoError(t, err)
			resp, err := rt.RoundTrip(req)
			require.Equal(t, map[bool]int{false: 1, true: 2}[h2], resp.ProtoMajor)
			got := trailers(t, resp, err)
			if tc.declared {
				assert.Equal(t, "told", got.Get("X-Declared"))
			}
			assert.Equal(t, "late", got.Get("X-Unannounced"))

			target, err := url.Parse(up.URL)
			require.NoError(t, err)
			proxied := func(rt http.RoundTripper) http.Header {
				proxy := httputil.NewSingleHostReverseProxy(target)
				proxy.Transport = rt
				front := httptest.NewServer(proxy)
				defer front.Close()
				resp, err := front.Client().Get(front.URL)
				return trailers(t, resp, err)
			}
			want := proxied(base)
			if !h2 {
				assert.Equal(t, "late", want.Get("X-Unannounced"), "the base alone")
			}
			assert.Equal(t, want, proxied(rt), "through a ReverseProxy, as with the base alone")
		})
	}
}

// With WithLinger, the slot of an exchange reclaimed by leak detection is
// kept the linger after the reclaim ends the exchange, as a cut's is: the
// upstream may count the stream until it notices the cut. Before, the
// slot went at once, and the next request could reach an upstream still
// counting the dropped one.
func TestTransportLeakedStreamLingers(t *testing.T) {
	var open, came atomic.Int64
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		came.Add(1)
		open.Add(1)
		defer open.Add(-1)
		streamUntilGone(r, w, w.(http.Flusher).Flush)
	}))
	base := startTLS(t, up, true)
	mock := testrig.NewSettingClock()
	lim := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithLogger(slog.New(slog.DiscardHandler)))
	client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
		slots.WithLinger(time.Second), slots.WithClock(mock))}
	func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, up.URL, nil)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		_ = resp // dropped: neither read nor closed
	}()
	require.Eventually(t, func() bool { return came.Load() == 1 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { runtime.GC(); return open.Load() == 0 }, 10*time.Second, time.Millisecond,
		"the reclaim ends the dropped exchange")
	// The upstream may see the end before the reclaim has set the linger's
	// timer (it does once the request body's Close has returned): advanced
	// before, the mock would never fire it (TestReclaimLingerBeginsAfterTheCut).
	mock.WaitSet(t, 1, time.Second)
	assert.Equal(t, 1, lim.InFlight(), "the slot is kept for the linger")
	assert.Zero(t, lim.Stats().Leaked, "reported as it is freed")
	mock.Add(time.Second)
	require.Eventually(t, func() bool { return lim.InFlight() == 0 && lim.Stats().Leaked == 1 }, 10*time.Second, time.Millisecond,
		"freed once the linger is over")
}
