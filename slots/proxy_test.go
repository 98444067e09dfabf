package slots_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// TestProxyErrorHandler runs a real ReverseProxy whose Transport admits
// with TryAcquire, so a second request meets the cap while the first one's
// stream is held.
func TestProxyErrorHandler(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	// A port nobody listens on: the upstream that is down.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := "http://" + ln.Addr().String()
	ln.Close()

	newProxy := func(upstream string, opts ...slots.MiddlewareOption) (*slots.Limiter, string) {
		target, err := url.Parse(upstream)
		require.NoError(t, err)
		lim := slots.NewLimiter(1)
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		gw := httptest.NewServer(&httputil.ReverseProxy{
			Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			Transport:    slots.NewTransport(base, func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() }),
			ErrorHandler: slots.ProxyErrorHandler(opts...),
		})
		t.Cleanup(gw.Close)
		return lim, gw.URL
	}
	client := newClient(t)
	get := func(u string) (*http.Response, string) {
		resp, err := client.Get(u)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}

	t.Run("a rejection is a 429 with Retry-After, not an empty 502", func(t *testing.T) {
		lim, gw := newProxy(up.URL)
		held, err := client.Get(gw)
		require.NoError(t, err)
		defer held.Body.Close()
		require.Equal(t, 1, lim.InFlight(), "the first stream holds the only slot")

		resp, body := get(gw)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		ms, err := strconv.Atoi(resp.Header.Get(slots.HeaderRetryAfterMs))
		assert.NoError(t, err, "retry-after-ms, read before Retry-After by the OpenAI and Anthropic SDKs")
		assert.True(t, ms > 0 && ms <= 1000, "retry-after-ms %d within the second Retry-After says", ms)
		assert.JSONEq(t, errorBody("rate_limit_error", "too many requests in flight: 1 of 1, 0 queued (limit reached)"), body)
	})
	t.Run("WithRejectStatus and WithErrorWriter apply", func(t *testing.T) {
		lim, gw := newProxy(up.URL, slots.WithRejectStatus(http.StatusServiceUnavailable),
			slots.WithErrorWriter(func(w http.ResponseWriter, status int, msg string) {
				w.WriteHeader(status)
				io.WriteString(w, "custom: "+msg)
			}))
		held, err := client.Get(gw)
		require.NoError(t, err)
		defer held.Body.Close()
		require.Equal(t, 1, lim.InFlight())

		resp, body := get(gw)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "1", resp.Header.Get("Retry-After"))
		assert.Equal(t, "custom: too many requests in flight: 1 of 1, 0 queued (limit reached)", body)
	})
	t.Run("an upstream that cannot be reached is a 502, and frees its slot", func(t *testing.T) {
		lim, gw := newProxy(down)
		resp, body := get(gw)
		assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		assert.Empty(t, resp.Header.Get("Retry-After"))
		assert.JSONEq(t, errorBody("api_error", "the upstream could not be reached"), body)
		assert.NotContains(t, body, ln.Addr().String(), "the upstream's address is not the client's business")
		assert.Equal(t, 0, lim.InFlight())
	})
	close(release)
}

// TestProxyErrorHandlerTellsAdmissionFromUpstream: ReverseProxy hands the
// ErrorHandler the Transport's refusals and the upstream's failures alike;
// only a refusal is answered as an admission error.
func TestProxyErrorHandlerTellsAdmissionFromUpstream(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // never answers in time
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	target, err := url.Parse(slow.URL)
	require.NoError(t, err)

	// serve runs a ReverseProxy to the slow upstream whose Transport admits
	// with admit, behind a handler that gives each request 100 ms.
	serve := func(t *testing.T, admit slots.AdmitFunc, opts ...slots.MiddlewareOption) (status int, retryAfter, body string) {
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		proxy := &httputil.ReverseProxy{
			Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
			Transport:    slots.NewTransport(base, admit),
			ErrorHandler: slots.ProxyErrorHandler(opts...),
		}
		gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 100*time.Millisecond)
			defer cancel()
			proxy.ServeHTTP(w, r.WithContext(ctx))
		}))
		t.Cleanup(gw.Close)
		resp, err := newClient(t).Get(gw.URL)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
	}

	t.Run("an upstream slow after the slot was granted is a 504, not a wait for capacity", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		status, ra, body := serve(t, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		assert.Equal(t, http.StatusGatewayTimeout, status)
		assert.Empty(t, ra)
		assert.JSONEq(t, errorBody("api_error", "the upstream did not answer in time"), body)
		waitFor(t, "the slot is freed", func() bool { return lim.InFlight() == 0 })
	})
	t.Run("a wait for capacity cut by the deadline is a 503 with Retry-After", func(t *testing.T) {
		lim := slots.NewLimiter(0)
		status, ra, body := serve(t, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		assert.Equal(t, http.StatusServiceUnavailable, status)
		assert.Equal(t, "1", ra)
		assert.JSONEq(t, errorBody("overloaded_error", "timed out waiting for capacity"), body)
	})
	t.Run("an admit function's unknown error is a 500, not the upstream's 502", func(t *testing.T) {
		status, _, body := serve(t, func(*http.Request) (*slots.Slot, error) { return nil, errors.New("store down") })
		assert.Equal(t, http.StatusInternalServerError, status)
		assert.JSONEq(t, errorBody("api_error", "the request could not be admitted"), body)
	})
	full := func(*http.Request) (*slots.Slot, error) { return slots.NewLimiter(0).TryAcquire() }
	// The error's type follows the status it is answered with.
	for code, kind := range map[int]string{slots.StatusClientClosedRequest: "invalid_request_error",
		http.StatusInternalServerError: "api_error", http.StatusBadGateway: "api_error"} {
		t.Run(fmt.Sprintf("WithRejectStatus(%d) answers a rejection with %[1]d and its reason", code), func(t *testing.T) {
			status, ra, body := serve(t, full, slots.WithRejectStatus(code))
			assert.Equal(t, code, status)
			assert.Equal(t, "1", ra)
			assert.JSONEq(t, errorBody(kind, "too many requests in flight: 0 of 0, 0 queued (limit reached)"), body)
		})
	}
	t.Run("HTTPStatus still reads a Transport's refusal through the client's error", func(t *testing.T) {
		client := &http.Client{Transport: slots.NewTransport(nil, full)}
		_, err := client.Get(slow.URL)
		require.Error(t, err)
		var le *slots.LimitError
		assert.ErrorAs(t, err, &le)
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		status, ra := slots.HTTPStatus(err)
		assert.Equal(t, http.StatusTooManyRequests, status)
		assert.Equal(t, time.Second, ra)
		assert.Contains(t, err.Error(), slots.ErrLimitReached.Error(), "the text is the admit function's")
	})
}
