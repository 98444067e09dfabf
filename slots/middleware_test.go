package slots_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

func TestHTTPStatus(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		retryAfter time.Duration
	}{
		{"no error", nil, 200, 0},
		{"limit reached", &slots.LimitError{Err: slots.ErrLimitReached, RetryAfter: 1500 * time.Millisecond}, 429, 2 * time.Second},
		{"queue full, wrapped", fmt.Errorf("gateway: %w", &slots.LimitError{Err: slots.ErrQueueFull, RetryAfter: 30 * time.Second}), 429, 30 * time.Second},
		{"an estimate under a second", &slots.LimitError{Err: slots.ErrWaitTimeout}, 429, time.Second},
		{"server deadline while waiting", fmt.Errorf("slots: acquire: %w", context.DeadlineExceeded), 503, time.Second},
		{"client went away", fmt.Errorf("slots: acquire: %w", context.Canceled), 499, 0},
		{"something else", errors.New("boom"), 500, 0},
		{"a bad request", fmt.Errorf("pacing: %w", &slots.BadRequestError{Reason: "model: want a string"}), 400, 0},
		{"a bad request with its status", &slots.BadRequestError{Status: 413, Reason: "too large"}, 413, 0},
		{"a store that cannot be reached, wrapped", fmt.Errorf("gateway: %w", unreachable(2500*time.Millisecond)), 503, 3 * time.Second},
		{"a deadline that says when", errors.Join(context.DeadlineExceeded, unreachable(2500*time.Millisecond)), 503, 3 * time.Second},
		{"a client gone, beside an error that says when", errors.Join(context.Canceled, unreachable(time.Second)), 499, 0},
		{"a bad priority, beside an error that says when", errors.Join(slots.ErrBadPriority, unreachable(time.Second)), 400, 0},
		{"a registry key too long (before, 500)", fmt.Errorf("%w: 5000 bytes, over the 4096-byte bound", registry.ErrInvalidKey), 400, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, ra := slots.HTTPStatus(tc.err)
			assert.Equal(t, tc.status, status)
			assert.Equal(t, tc.retryAfter, ra)
		})
	}
}

// unreachable is an error that says when to try again, as the fleet's
// *UnavailableError does.
type unreachable time.Duration

func (u unreachable) Error() string             { return "store unavailable" }
func (u unreachable) RetryAfter() time.Duration { return time.Duration(u) }

// HTTPStatus allocates nothing more than the LimitError it looks for
// (found or not), for a refusal or a client gone: it is asked at each
// one. A passed deadline costs one more (is there a RetryAfter?), an
// error it does not know three.
func TestHTTPStatusAllocs(t *testing.T) {
	for _, err := range []error{nil, &slots.LimitError{Err: slots.ErrQueueFull}, context.Canceled} {
		assert.LessOrEqual(t, testing.AllocsPerRun(100, func() { slots.HTTPStatus(err) }), 1.0, "%v", err)
	}
	deadline := fmt.Errorf("slots: acquire: %w", context.DeadlineExceeded)
	assert.LessOrEqual(t, testing.AllocsPerRun(100, func() { slots.HTTPStatus(deadline) }), 2.0)
}

// WriteError tells such an error's Retry-After to the millisecond too.
func TestWriteErrorOfAnUnreachableStore(t *testing.T) {
	rec := httptest.NewRecorder()
	slots.WriteError(rec, unreachable(2500*time.Millisecond))
	assert.Equal(t, 503, rec.Code)
	assert.Equal(t, "3", rec.Header().Get("Retry-After"))
	assert.Equal(t, "2500", rec.Header().Get(slots.HeaderRetryAfterMs))
}

// A client is told a bad request's reason, and nothing of an error the
// package does not know.
func TestErrorMessageOfABadRequest(t *testing.T) {
	assert.Equal(t, "model: want a string", slots.ErrorMessage(fmt.Errorf("pacing: %w", &slots.BadRequestError{Reason: "model: want a string"})))
	assert.Equal(t, "the request could not be admitted", slots.ErrorMessage(errors.New("dial tcp 10.0.0.7:443: secret-host")))
}

// A refusal by a budget per minute (as pacing and a fleet name them) is
// told as what started in the last minute: before, it read "too many
// requests in flight under the tokens_per_minute cap", with nothing in
// flight, and its tokens counted as requests.
func TestErrorMessageOfABudgetPerMinute(t *testing.T) {
	overBudget := errors.New("pacing: over budget") // pacing.ErrOverBudget's text
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"tokens, refused at once", &slots.LimitError{Err: overBudget, Cap: "tokens_per_minute", InFlight: 900, Limit: 1000, RetryAfter: time.Minute},
			"over the tokens_per_minute budget: 900 of 1000 tokens started in the last minute"},
		{"a model's requests", fmt.Errorf("gateway: %w", &slots.LimitError{Err: overBudget, Cap: "model_max_requests_per_minute", InFlight: 1, Limit: 1}),
			"over the model_max_requests_per_minute budget: 1 of 1 requests started in the last minute"},
		{"a key's output tokens, after a wait", &slots.LimitError{Err: slots.ErrWaitTimeout, Cap: "api_key_output_tokens_per_minute", InFlight: 5000, Limit: 5000, Queued: 2},
			"over the api_key_output_tokens_per_minute budget: 5000 of 5000 tokens started in the last minute (timed out waiting)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := slots.ErrorMessage(tc.err)
			assert.Equal(t, tc.want, msg)
			assert.NotContains(t, msg, "in flight")
		})
	}
}

func TestMiddleware(t *testing.T) {
	t.Run("the handler runs holding a slot; a rejection is a 429 with Retry-After and a plain message", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		inHandler, leave := make(chan struct{}), make(chan struct{})
		h := slots.Middleware(func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() })(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(inHandler)
				<-leave
				fmt.Fprint(w, "done")
			}))
		var wg sync.WaitGroup
		wg.Go(func() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
			assert.Equal(t, "done", rec.Body.String())
		})
		<-inHandler
		assert.Equal(t, 1, lim.InFlight())

		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil))
		assert.Equal(t, http.StatusTooManyRequests, rec.Code)
		assert.Equal(t, "1", rec.Header().Get("Retry-After"))
		assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
		assert.JSONEq(t, errorBody("rate_limit_error", "too many requests in flight: 1 of 1, 0 queued (limit reached)"), rec.Body.String())

		close(leave)
		wg.Wait()
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("503 when configured", func(t *testing.T) {
		lim := slots.NewLimiter(0)
		h := slots.Middleware(func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() }, slots.WithRejectStatus(http.StatusServiceUnavailable))(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler must not run") }))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
		assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	})
	t.Run("an error writer sets the body's format", func(t *testing.T) {
		lim := slots.NewLimiter(0)
		var gotStatus int
		h := slots.Middleware(func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() },
			slots.WithErrorWriter(func(w http.ResponseWriter, status int, msg string) {
				gotStatus = status
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				fmt.Fprintf(w, `{"message":%q}`, msg)
			}))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler must not run") }))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, http.StatusTooManyRequests, gotStatus)
		assert.Equal(t, http.StatusTooManyRequests, rec.Code)
		assert.Equal(t, "1", rec.Header().Get("Retry-After"), "set before the writer runs")
		assert.JSONEq(t, `{"message":"too many requests in flight: 0 of 0, 0 queued (limit reached)"}`, rec.Body.String())
	})
	t.Run("a panicking handler frees its slot and the panic goes on", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		h := slots.Middleware(func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })(
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("handler bug") }))
		assert.PanicsWithValue(t, "handler bug", func() {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		})
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("a streaming handler holds its slot for the whole stream, over a real server", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		next := make(chan struct{})
		srv := httptest.NewServer(slots.Middleware(func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for i := range 3 {
					<-next
					fmt.Fprintf(w, "data: %d\n\n", i)
					w.(http.Flusher).Flush()
				}
			})))
		t.Cleanup(srv.Close)
		client := newClient(t)
		got := make(chan string, 1)
		go func() {
			resp, err := client.Get(srv.URL)
			if assert.NoError(t, err) {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got <- string(b)
			}
		}()
		next <- struct{}{}
		waitFor(t, "the stream holds the slot", func() bool { return lim.InFlight() == 1 })
		next <- struct{}{}
		assert.Equal(t, 1, lim.InFlight())
		next <- struct{}{}
		assert.Equal(t, "data: 0\n\ndata: 1\n\ndata: 2\n\n", <-got)
		waitFor(t, "released with the stream's end", func() bool { return lim.InFlight() == 0 })
	})
	t.Run("nil admit panics with the package prefix", func(t *testing.T) {
		assert.PanicsWithValue(t, "slots: Middleware needs an admit function", func() { slots.Middleware(nil) })
	})
}

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	slots.WriteError(rec, &slots.LimitError{Err: slots.ErrQueueFull, Key: "sk-secret-key", InFlight: 8, Limit: 8, Queued: 256, RetryAfter: 40 * time.Second})
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "40", rec.Header().Get("Retry-After"))
	assert.Equal(t, "40000", rec.Header().Get(slots.HeaderRetryAfterMs))
	assert.NotContains(t, rec.Body.String(), "sk-secret-key", "keys may be credentials: never in a response")
	assert.JSONEq(t, errorBody("rate_limit_error", "too many requests in flight: 8 of 8, 256 queued (queue full)"), rec.Body.String())
}

// A refusal's Retry-After goes out in whole seconds, rounded up, and to
// the millisecond in retry-after-ms, also rounded up, whichever seam
// answers it, and whatever the ErrorWriter does.
func TestRetryAfterMs(t *testing.T) {
	refusal := &slots.LimitError{Err: slots.ErrLimitReached, RetryAfter: 1500*time.Millisecond + 300*time.Microsecond}
	check := func(name string, h http.Header) {
		assert.Equal(t, "2", h.Get("Retry-After"), name)
		assert.Equal(t, "1501", h.Get("retry-after-ms"), name)
	}
	rec := httptest.NewRecorder()
	slots.WriteError(rec, refusal)
	check("WriteError", rec.Header())

	silent := slots.WithErrorWriter(func(http.ResponseWriter, int, string) {}) // writes nothing
	rec = httptest.NewRecorder()
	slots.Middleware(func(*http.Request) (*slots.Slot, error) { return nil, refusal }, silent)(http.NotFoundHandler()).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	check("Middleware", rec.Header())

	rec = httptest.NewRecorder()
	slots.WriteError(rec, errors.New("not a refusal"))
	assert.Empty(t, rec.Header().Get("Retry-After"))
	assert.Empty(t, rec.Header().Get("retry-after-ms"))
}

func TestErrorMessageHasNoPackagePrefixes(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"limit reached", &slots.LimitError{Err: slots.ErrLimitReached, InFlight: 2, Limit: 2}, "too many requests in flight: 2 of 2, 0 queued (limit reached)"},
		{"wait timeout, wrapped", fmt.Errorf("gateway: %w", &slots.LimitError{Err: slots.ErrWaitTimeout, InFlight: 5, Limit: 5, Queued: 3}), "too many requests in flight: 5 of 5, 3 queued (timed out waiting)"},
		{"no limit to show", &slots.LimitError{Err: slots.ErrQueueFull, Limit: slots.Unlimited}, "too many requests in flight (queue full)"},
		{"server deadline", fmt.Errorf("slots: acquire: %w", context.DeadlineExceeded), "timed out waiting for capacity"},
		{"client gone", context.Canceled, "the request was cancelled while waiting for capacity"},
		{"bad priority", fmt.Errorf("%w %q", slots.ErrBadPriority, "urgent"), "unknown priority (want interactive, default or batch)"},
		{"anything else says nothing of itself", errors.New("dial tcp 10.0.0.7:443: secret-host"), "the request could not be admitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := slots.ErrorMessage(tc.err)
			assert.Equal(t, tc.want, msg)
			assert.NotContains(t, msg, "slots:")
		})
	}
}

type eofReader struct{ data string }

func (r *eofReader) Read(p []byte) (int, error) {
	if r.data == "" {
		return 0, io.EOF
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

type writerToBody struct{ *strings.Reader }

func (writerToBody) Close() error { return nil }

type rwBody struct {
	io.Reader
	written strings.Builder
}

func (b *rwBody) Write(p []byte) (int, error) { return b.written.Write(p) }
func (b *rwBody) Close() error                { return nil }

func TestWrapBody(t *testing.T) {
	acquire := func(t *testing.T) (*slots.Limiter, *slots.Slot) {
		lim := slots.NewLimiter(1)
		s, err := lim.TryAcquire()
		require.NoError(t, err)
		return lim, s
	}
	t.Run("released by the Read that returns io.EOF", func(t *testing.T) {
		lim, s := acquire(t)
		b := slots.WrapBody(io.NopCloser(&eofReader{data: "abc"}), s)
		got, err := io.ReadAll(b)
		require.NoError(t, err)
		assert.Equal(t, "abc", string(got))
		assert.Equal(t, 0, lim.InFlight())
		assert.NoError(t, b.Close())
		assert.Equal(t, uint64(0), lim.Stats().DoubleReleases, "EOF then Close is not misuse")
	})
	t.Run("released by a Read error", func(t *testing.T) {
		lim, s := acquire(t)
		_, err := slots.WrapBody(io.NopCloser(failingReader{}), s).Read(make([]byte, 8))
		assert.Error(t, err)
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("released by Close midway", func(t *testing.T) {
		lim, s := acquire(t)
		b := slots.WrapBody(io.NopCloser(strings.NewReader("abcdef")), s)
		_, _ = b.Read(make([]byte, 2))
		assert.Equal(t, 1, lim.InFlight())
		require.NoError(t, b.Close())
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("nil and http.NoBody release at once and are returned as they are", func(t *testing.T) {
		lim, s := acquire(t)
		assert.Nil(t, slots.WrapBody(nil, s))
		assert.Equal(t, 0, lim.InFlight())
		lim, s = acquire(t)
		assert.Equal(t, http.NoBody, slots.WrapBody(http.NoBody, s))
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("keeps io.WriterTo, released when it reaches the end", func(t *testing.T) {
		lim, s := acquire(t)
		b := slots.WrapBody(writerToBody{strings.NewReader("stream")}, s)
		wt, ok := b.(io.WriterTo)
		require.True(t, ok)
		var sb strings.Builder
		_, err := wt.WriteTo(&sb)
		require.NoError(t, err)
		assert.Equal(t, "stream", sb.String())
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("keeps Write, for an upgraded connection", func(t *testing.T) {
		lim, s := acquire(t)
		inner := &rwBody{Reader: strings.NewReader("")}
		b := slots.WrapBody(inner, s)
		rw, ok := b.(io.ReadWriteCloser)
		require.True(t, ok)
		_, err := rw.Write([]byte("ping"))
		require.NoError(t, err)
		assert.Equal(t, "ping", inner.written.String())
		assert.Equal(t, 1, lim.InFlight(), "writing does not end the body")
		rw.Close()
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("concurrent Read and Close release exactly once", func(t *testing.T) {
		for range 200 {
			lim, s := acquire(t)
			b := slots.WrapBody(io.NopCloser(&eofReader{data: strings.Repeat("x", 64)}), s)
			var wg sync.WaitGroup
			wg.Go(func() { _, _ = io.Copy(io.Discard, b) })
			wg.Go(func() { _ = b.Close() })
			wg.Wait()
			require.Equal(t, 0, lim.InFlight())
			require.Equal(t, uint64(0), lim.Stats().DoubleReleases)
			_, err := lim.TryAcquire()
			require.NoError(t, err, "exactly one unit came back")
		}
	})
}

// TestErrorWriterStatusIsEnforced: an ErrorWriter that forgets the status
// must not turn a rejection into a 200, whether it writes nothing or only a
// body; the answer goes over a real server, as a client sees it.
func TestErrorWriterStatusIsEnforced(t *testing.T) {
	writers := []struct {
		name string
		ew   slots.ErrorWriter
		body string
	}{
		{"a writer that writes nothing", func(http.ResponseWriter, int, string) {}, ""},
		{"a writer that writes a body without WriteHeader", func(w http.ResponseWriter, _ int, msg string) {
			io.WriteString(w, "busy: "+msg)
		}, "busy: too many requests in flight: 0 of 0, 0 queued (limit reached)"},
		// Before, a Flush before WriteHeader reached the server's writer
		// past the status (through Unwrap), and the refusal went out as 200;
		// through http.Flusher, it panicked.
		{"a writer that flushes through ResponseController before WriteHeader", func(w http.ResponseWriter, _ int, msg string) {
			_ = http.NewResponseController(w).Flush()
			io.WriteString(w, "busy: "+msg)
		}, "busy: too many requests in flight: 0 of 0, 0 queued (limit reached)"},
		{"a writer that flushes as an http.Flusher before WriteHeader", func(w http.ResponseWriter, _ int, msg string) {
			w.(http.Flusher).Flush()
			io.WriteString(w, "busy: "+msg)
		}, "busy: too many requests in flight: 0 of 0, 0 queued (limit reached)"},
	}
	full := func(*http.Request) (*slots.Slot, error) { return slots.NewLimiter(0).TryAcquire() }
	for _, tc := range writers {
		t.Run("Middleware: "+tc.name+" still answers 429 with Retry-After", func(t *testing.T) {
			srv := httptest.NewServer(slots.Middleware(full, slots.WithErrorWriter(tc.ew))(
				http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler must not run") })))
			t.Cleanup(srv.Close)
			resp, err := newClient(t).Get(srv.URL)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "1", resp.Header.Get("Retry-After"))
			assert.Equal(t, tc.body, string(body))
		})
		t.Run("ProxyErrorHandler: "+tc.name+" still answers 429 with Retry-After", func(t *testing.T) {
			srv := httptest.NewServer(&httputil.ReverseProxy{
				Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(&url.URL{Scheme: "http", Host: "upstream.invalid"}) },
				Transport:    slots.NewTransport(nil, full),
				ErrorHandler: slots.ProxyErrorHandler(slots.WithErrorWriter(tc.ew)),
			})
			t.Cleanup(srv.Close)
			resp, err := newClient(t).Get(srv.URL)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "1", resp.Header.Get("Retry-After"))
			assert.Equal(t, tc.body, string(body))
		})
	}
	t.Run("a writer's own status is kept", func(t *testing.T) {
		h := slots.Middleware(full, slots.WithErrorWriter(func(w http.ResponseWriter, _ int, _ string) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}))(http.NotFoundHandler())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code)
	})
	t.Run("a writer that panics leaks no slot, and the panic goes on", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		admit := func(*http.Request) (*slots.Slot, error) {
			s, _ := lim.TryAcquire()
			return s, &slots.LimitError{Err: slots.ErrLimitReached}
		}
		h := slots.Middleware(admit, slots.WithErrorWriter(func(http.ResponseWriter, int, string) {
			assert.Equal(t, 0, lim.InFlight(), "released before the writer runs")
			panic("writer bug")
		}))(http.NotFoundHandler())
		assert.PanicsWithValue(t, "writer bug", func() {
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		})
		assert.Equal(t, 0, lim.InFlight())
	})
}

// A Retry-After too large for milliseconds in an int64 saturates rather
// than wraps, and an ErrorWriter that sets a Retry-After of its own is not
// contradicted by retry-after-ms.
func TestRetryAfterMsEdges(t *testing.T) {
	rec := httptest.NewRecorder()
	slots.WriteError(rec, &slots.LimitError{Err: slots.ErrQueueFull, RetryAfter: math.MaxInt64})
	ms, err := strconv.ParseInt(rec.Header().Get("retry-after-ms"), 10, 64)
	require.NoError(t, err)
	assert.Positive(t, ms)

	h := http.Header{}
	slots.SetRetryAfter(h, 0)
	assert.Empty(t, h, "no estimate, no headers")
	slots.SetRetryAfter(h, 1500*time.Millisecond)
	assert.Equal(t, "2", h.Get("Retry-After"))
	assert.Equal(t, "1500", h.Get("retry-after-ms"))

	own := slots.WithErrorWriter(func(w http.ResponseWriter, status int, _ string) {
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(status)
	})
	rec = httptest.NewRecorder()
	slots.Middleware(func(*http.Request) (*slots.Slot, error) {
		return nil, &slots.LimitError{Err: slots.ErrLimitReached, RetryAfter: 300 * time.Millisecond}
	}, own)(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, "60", rec.Header().Get("Retry-After"))
	assert.Empty(t, rec.Header().Get("retry-after-ms"), "not 300 beside the writer's 60 s")
}

// A request heavier than its whole cap is answered 413 (waiting cannot
// help) by Middleware and ProxyErrorHandler, as by WriteError, whatever
// status WithRejectStatus sets for the other refusals.
func TestExceedsLimitIs413Everywhere(t *testing.T) {
	lim := slots.NewLimiter(10)
	admit := func(*http.Request) (*slots.Slot, error) { return lim.TryAcquireN(11) }
	_, err := admit(nil)
	require.ErrorIs(t, err, slots.ErrExceedsLimit)
	rec := httptest.NewRecorder()
	slots.WriteError(rec, err)
	assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, "WriteError")
	for _, opts := range [][]slots.MiddlewareOption{nil, {slots.WithRejectStatus(http.StatusServiceUnavailable)}} {
		rec = httptest.NewRecorder()
		slots.Middleware(admit, opts...)(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
		assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, "Middleware %v", opts)
		assert.Empty(t, rec.Header().Get("Retry-After"))
		_, rtErr := slots.NewTransport(http.DefaultTransport, admit).RoundTrip(httptest.NewRequest(http.MethodPost, "http://x.invalid/", nil))
		rec = httptest.NewRecorder()
		slots.ProxyErrorHandler(opts...)(rec, httptest.NewRequest(http.MethodPost, "/", nil), rtErr)
		assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code, "ProxyErrorHandler %v", opts)
	}
}

// errorBody is the JSON answer Middleware, ProxyErrorHandler and
// WriteError give by default: the LLM APIs' error shape.
func errorBody(kind, message string) string {
	b, err := json.Marshal(map[string]any{"error": map[string]string{"type": kind, "message": message}})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// An error's type in the LLM APIs' shape follows its status.
func TestErrorType(t *testing.T) {
	for status, want := range map[int]string{401: "authentication_error", 403: "permission_error", 404: "not_found_error",
		413: "invalid_request_error", 429: "rate_limit_error", 499: "invalid_request_error", 500: "api_error",
		502: "api_error", 503: "overloaded_error", 200: "api_error"} {
		assert.Equal(t, want, slots.ErrorType(status), "%d", status)
	}
}
