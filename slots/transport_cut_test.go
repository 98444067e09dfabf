package slots_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// heldBody is a response body whose Close takes until the test lets it
// finish, as net/http's does while its read loop gives the connection up.
// A Read waits until the body is closed, then fails as a read on a closed
// connection does.
type heldBody struct {
	closing  chan struct{} // closed when Close starts
	proceed  chan struct{} // Close returns once this is closed
	closed   chan struct{}
	failRead bool // Read fails at once instead of waiting for Close
}

func newHeldBody() *heldBody {
	return &heldBody{closing: make(chan struct{}), proceed: make(chan struct{}), closed: make(chan struct{})}
}

func (b *heldBody) Read([]byte) (int, error) {
	if !b.failRead {
		<-b.closed
	}
	return 0, errors.New("read tcp: use of closed network connection")
}

func (b *heldBody) Close() error {
	close(b.closing)
	<-b.proceed
	close(b.closed)
	return nil
}

func (b *heldBody) closeStarted() bool {
	select {
	case <-b.closing:
		return true
	default:
		return false
	}
}

// answering returns a base RoundTripper that answers 200 with body.
func answering(body io.ReadCloser) http.RoundTripper {
	return roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Body: body}, nil
	})
}

// TestTransportCutClosesBeforeItFrees: a cut exchange gives its slot back
// only once this side has let go of the upstream: the body's Close has
// returned. Otherwise the next request reaches the upstream while the cut
// one still holds its connection there.
//
// "Let go" is what the base transport's Close gives. net/http's HTTP/1
// transport returns from an early Close once its read loop has given the
// connection up; the loop closes the socket on its own goroutine an instant
// later. Its HTTP/2 transport returns once the stream's reset is sent,
// except after the request's context ended, when the reset goes
// concurrently. The upstream counts the request until the close reaches it
// and its server notices: that is the time WithLinger covers.
func TestTransportCutClosesBeforeItFrees(t *testing.T) {
	t.Run("the request's context ends: the body is closed, then the slot freed", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			lim := slots.NewLimiter(1)
			body := newHeldBody()
			tr := slots.NewTransport(answering(body), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			ctx, cancel := context.WithCancel(context.Background())
			resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx))
			require.NoError(t, err)

			cancel() // nobody reads or closes the body
			synctest.Wait()
			assert.True(t, body.closeStarted(), "the end of the context closes the body")
			assert.Equal(t, 1, lim.InFlight(), "the slot is held while the body closes")
			close(body.proceed)
			synctest.Wait()
			assert.Equal(t, 0, lim.InFlight(), "freed once the body is closed")
			assert.NoError(t, resp.Body.Close())
			assert.Equal(t, uint64(0), lim.Stats().DoubleReleases)
		})
	})
	t.Run("a failed Read closes the body, then frees the slot", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			lim := slots.NewLimiter(1)
			body := newHeldBody()
			body.failRead = true
			tr := slots.NewTransport(answering(body), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
			require.NoError(t, err)

			readErr := make(chan error, 1)
			go func() {
				_, err := resp.Body.Read(make([]byte, 8))
				readErr <- err
			}()
			synctest.Wait()
			assert.True(t, body.closeStarted(), "a broken exchange is closed")
			assert.Equal(t, 1, lim.InFlight(), "the slot is held while the body closes")
			close(body.proceed)
			synctest.Wait()
			assert.Error(t, <-readErr)
			assert.Equal(t, 0, lim.InFlight())
		})
	})
	t.Run("a Read that meets the context's end fails with the context's error", func(t *testing.T) {
		// httputil.ReverseProxy logs every read error but context.Canceled.
		testrig.Bubble(t, func(t *testing.T) {
			lim := slots.NewLimiter(1)
			body := newHeldBody()
			close(body.proceed)
			tr := slots.NewTransport(answering(body), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			ctx, cancel := context.WithCancel(context.Background())
			resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx))
			require.NoError(t, err)
			readErr := make(chan error, 1)
			go func() {
				_, err := resp.Body.Read(make([]byte, 8))
				readErr <- err
			}()
			synctest.Wait()
			cancel()
			synctest.Wait()
			select {
			case err := <-readErr:
				assert.Equal(t, context.Canceled, err)
			default:
				assert.Fail(t, "the Read still waits after the context ended")
				resp.Body.Close()
				<-readErr
			}
			assert.Equal(t, 0, lim.InFlight())
		})
	})
	t.Run("a response that comes with an error is closed before its slot goes", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		heldDuringClose := -1
		body := closeFunc(func() error { heldDuringClose = lim.InFlight(); return nil })
		tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Body: body}, errors.New("broken")
		}), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		assert.Error(t, err)
		assert.Equal(t, 1, heldDuringClose)
		assert.Equal(t, 0, lim.InFlight())
	})
}

// closeFunc is an empty body whose Close calls the function.
type closeFunc func() error

func (closeFunc) Read([]byte) (int, error) { return 0, io.EOF }
func (f closeFunc) Close() error           { return f() }

// TestTransportLinger: WithLinger keeps a cut exchange's slot for its
// duration after the body is closed, on the Transport's clock; a response
// read to its end, one without a body and a failed dial free at once.
func TestTransportLinger(t *testing.T) {
	const linger = 250 * time.Millisecond
	// rig runs f in a bubble with a Transport over base that lingers on a
	// mock clock.
	rig := func(t *testing.T, base http.RoundTripper, f func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport)) {
		testrig.Bubble(t, func(t *testing.T) {
			lim := slots.NewLimiter(1)
			clk := clock.NewMock()
			tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
				slots.WithLinger(linger), slots.WithClock(clk))
			f(t, lim, clk, tr)
		})
	}
	// heldForTheLinger checks that the slot is freed exactly when the
	// linger has passed on clk.
	heldForTheLinger := func(t *testing.T, lim *slots.Limiter, clk *clock.Mock) {
		t.Helper()
		synctest.Wait()
		assert.Equal(t, 1, lim.InFlight(), "held after the cut")
		clk.Add(linger - time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, 1, lim.InFlight(), "held until the linger has passed")
		clk.Add(time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, 0, lim.InFlight(), "freed when it has")
	}
	stream := func() http.RoundTripper {
		return answering(io.NopCloser(strings.NewReader("data: {}\n\ndata: [DONE]\n\n")))
	}
	get := func(ctx context.Context) *http.Request {
		return httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx)
	}

	t.Run("a stream cut by the end of its context", func(t *testing.T) {
		rig(t, stream(), func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			ctx, cancel := context.WithCancel(context.Background())
			resp, err := tr.RoundTrip(get(ctx))
			require.NoError(t, err)
			cancel()
			heldForTheLinger(t, lim, clk)
			resp.Body.Close()
		})
	})
	t.Run("a body closed before its end", func(t *testing.T) {
		rig(t, stream(), func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			resp, err := tr.RoundTrip(get(context.Background()))
			require.NoError(t, err)
			_, _ = resp.Body.Read(make([]byte, 4))
			require.NoError(t, resp.Body.Close())
			heldForTheLinger(t, lim, clk)
		})
	})
	t.Run("a body whose Read fails", func(t *testing.T) {
		body := newHeldBody()
		body.failRead = true
		close(body.proceed)
		rig(t, answering(body), func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			resp, err := tr.RoundTrip(get(context.Background()))
			require.NoError(t, err)
			_, err = resp.Body.Read(make([]byte, 4))
			require.Error(t, err)
			heldForTheLinger(t, lim, clk)
		})
	})
	t.Run("a round trip that fails after the request may have gone", func(t *testing.T) {
		failing := roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, errors.New("net/http: timeout awaiting response headers")
		})
		rig(t, failing, func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			_, err := tr.RoundTrip(get(context.Background()))
			require.Error(t, err)
			heldForTheLinger(t, lim, clk)
		})
	})
	t.Run("a failed dial frees at once", func(t *testing.T) {
		refused := roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
		})
		rig(t, refused, func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			_, err := tr.RoundTrip(get(context.Background()))
			require.Error(t, err)
			assert.Equal(t, 0, lim.InFlight())
		})
	})
	t.Run("a request whose context ends as it is admitted frees at once", func(t *testing.T) {
		var hits atomic.Int32
		up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
		t.Cleanup(up.Close)
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		lim := slots.NewLimiter(1)
		ctx, cancel := context.WithCancel(context.Background())
		tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) {
			defer cancel() // the caller goes away as the slot is granted
			return lim.Acquire(r.Context())
		}, slots.WithLinger(linger), slots.WithClock(clock.NewMock()))
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, up.URL, nil).WithContext(ctx))
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 0, lim.InFlight(), "never sent: no linger")
		assert.Zero(t, hits.Load())
	})
	t.Run("a request whose context ends while it waits for a connection frees at once", func(t *testing.T) {
		// net/http's Transport gives it up unsent, and says so only with
		// the bare context error.
		arrived, release := make(chan struct{}, 1), make(chan struct{})
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(up.Close)
		base := &http.Transport{MaxConnsPerHost: 1} // the first request's connection is the only one
		t.Cleanup(base.CloseIdleConnections)
		lim := slots.NewLimiter(2)
		tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
			slots.WithLinger(linger), slots.WithClock(clock.NewMock()))
		first := make(chan error, 1)
		go func() {
			resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, up.URL, nil))
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			first <- err
		}()
		<-arrived
		asked := make(chan struct{})
		ctx, cancel := context.WithCancel(httptrace.WithClientTrace(context.Background(),
			&httptrace.ClientTrace{GetConn: func(string) { close(asked) }}))
		go func() { <-asked; cancel() }()
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, up.URL, nil).WithContext(ctx))
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 1, lim.InFlight(), "the first request's slot only: no linger for one never sent")
		close(release)
		require.NoError(t, <-first)
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("a request its base chose not to send frees at once, answered as a refusal", func(t *testing.T) {
		over := &slots.LimitError{Err: errors.New("over budget"), Cap: "budget", RetryAfter: 3 * time.Second}
		notSent := roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, fmt.Errorf("%w: %w", slots.ErrNotSent, over)
		})
		rig(t, notSent, func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			_, err := tr.RoundTrip(get(context.Background()))
			require.ErrorIs(t, err, slots.ErrNotSent)
			assert.Equal(t, 0, lim.InFlight(), "no linger for a request never sent")
			w := httptest.NewRecorder()
			slots.ProxyErrorHandler()(w, get(context.Background()), err)
			assert.Equal(t, http.StatusTooManyRequests, w.Code, "a refusal, not the upstream's failure: %s", w.Body)
			assert.Equal(t, "3", w.Header().Get("Retry-After"))
		})
	})
	t.Run("a body read to its end frees at once", func(t *testing.T) {
		rig(t, stream(), func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			resp, err := tr.RoundTrip(get(ctx))
			require.NoError(t, err)
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, 0, lim.InFlight())
			cancel()
			require.NoError(t, resp.Body.Close())
			synctest.Wait()
			assert.Equal(t, 0, lim.InFlight())
			assert.Equal(t, uint64(0), lim.Stats().DoubleReleases)
		})
	})
	t.Run("a response without a body frees at once", func(t *testing.T) {
		rig(t, answering(http.NoBody), func(t *testing.T, lim *slots.Limiter, clk *clock.Mock, tr *slots.Transport) {
			resp, err := tr.RoundTrip(get(context.Background()))
			require.NoError(t, err)
			assert.Equal(t, http.NoBody, resp.Body)
			assert.Equal(t, 0, lim.InFlight())
		})
	})
	t.Run("without WithLinger a cut frees as soon as the body is closed", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		tr := slots.NewTransport(stream(), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		resp, err := tr.RoundTrip(get(context.Background()))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, 0, lim.InFlight())
	})
}

func ExampleWithLinger() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"delta\":\"a long answer\"}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // streams until the client goes away
	}))
	defer upstream.Close()

	// A cut stream keeps its slot for a second after the gateway has closed
	// its connection: the upstream counts it until it notices. (The mock
	// clock stands in for time here.)
	released := make(chan struct{}, 1)
	lim := slots.NewLimiter(4, slots.WithObserver(slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased {
			released <- struct{}{}
		}
	})))
	clk := clock.NewMock()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) {
		return lim.Acquire(r.Context())
	}, slots.WithLinger(time.Second), slots.WithClock(clk))}

	resp, err := client.Get(upstream.URL + "/v1/chat/completions")
	if err != nil {
		return
	}
	resp.Body.Close() // the client goes away midway
	fmt.Println("after the cut:", lim.InFlight())
	clk.Add(time.Second)
	<-released
	fmt.Println("a second later:", lim.InFlight())
	// Output:
	// after the cut: 1
	// a second later: 0
}

// The end of the request's context frees the slot even when the body's
// Close does not return (it waits for a Read stuck on a silent upstream):
// cutCloseWait (5 s) after the context ended at the latest.
func TestTransportContextEndFreesDespiteAStuckClose(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		lim := slots.NewLimiter(1)
		body := newHeldBody()
		tr := slots.NewTransport(answering(body), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		ctx, cancel := context.WithCancel(context.Background())
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx))
		require.NoError(t, err)
		cancel()
		synctest.Wait()
		require.True(t, body.closeStarted())
		assert.Equal(t, 1, lim.InFlight(), "held while Close may still return")
		time.Sleep(5*time.Second - time.Nanosecond)
		synctest.Wait()
		assert.Equal(t, 1, lim.InFlight())
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		assert.Zero(t, lim.InFlight(), "freed 5 s after the context ended, Close or not")
		close(body.proceed)
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, uint64(1), lim.Stats().Released, "released once")
	})
}

// A base that returns as the request's context ends: the watch may start
// while RoundTrip is still setting the body up (under -race this was a data
// race on the watch's stop func).
func TestTransportContextEndsAsTheResponseComes(t *testing.T) {
	lim := slots.NewLimiter(1)
	for range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		base := roundTripFunc(func(*http.Request) (*http.Response, error) {
			cancel()
			return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("x"))}, nil
		})
		tr := slots.NewTransport(base, func(*http.Request) (*slots.Slot, error) { return lim.Acquire(context.Background()) })
		resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx))
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
	assert.Zero(t, lim.InFlight())
}

// A request written on a reused connection that breaks, which net/http
// then tries again on a new one whose dial fails, may have reached the
// upstream (it read it here): a cut, which keeps its slot for the linger,
// not a request never sent.
func TestTransportLingerRetryDialAfterSending(t *testing.T) {
	var hits atomic.Int32
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			return
		}
		srv.Listener.Close() // the retry's dial is refused
		if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
			c.Close() // read, then gone without an answer
		}
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	lim := slots.NewLimiter(2)
	clk := clock.NewMock()
	tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) },
		slots.WithLinger(time.Hour), slots.WithClock(clk))
	resp, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, srv.URL, nil))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, 0, lim.InFlight())

	_, err = tr.RoundTrip(httptest.NewRequest(http.MethodGet, srv.URL, nil))
	var op *net.OpError
	require.ErrorAs(t, err, &op)
	require.Equal(t, "dial", op.Op, "net/http tried it again on a new connection, whose dial failed")
	require.Equal(t, int32(2), hits.Load(), "the upstream read the second request")
	assert.Equal(t, 1, lim.InFlight(), "it may have been sent: held for the linger")
	clk.Add(time.Hour)
	require.Eventually(t, func() bool { return lim.InFlight() == 0 }, 5*time.Second, time.Millisecond)
}
