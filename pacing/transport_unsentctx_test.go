package pacing_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// budgetsLeft returns what each budget of gate has left, by cap.
func budgetsLeft(gate *pacing.Gate) map[string]int {
	m := map[string]int{}
	for _, b := range gate.Budgets() {
		m[b.Cap+"/"+b.Model+"/"+b.Key] = b.Left
	}
	return m
}

// A request whose context ends after its admission, before net/http's
// Transport has a connection for it, never reached the upstream: it
// charges nothing, its slot is free at once, and its Trace hears it
// settled unserved. Both ways net/http gives up such a request: its
// context ended before it was handed over, and it ended while it waited
// for a connection (here behind MaxConnsPerHost, as behind a slow dial).
// Before, the error was the bare context's, which the Transport took for
// a request that may have been sent: its estimate and its request stood
// charged (found by a bug hunt).
func TestTransportContextEndedBeforeSending(t *testing.T) {
	var hits atomic.Int32
	hold := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-hold
		w.Write([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	}))
	defer srv.Close()
	defer close(hold) // before the server closes: its handlers return
	base := &http.Transport{MaxConnsPerHost: 1}
	defer base.CloseIdleConnections()
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 10,
		BudgetLimits: pacing.BudgetLimits{TokensPerMinute: 10000, MaxRequestsPerMinute: 10}})
	rt := pacing.NewTransport(base, gate, pacing.WithCutLinger(time.Hour))
	send := func(ctx context.Context) (*http.Response, error) {
		ctx = pacing.WithTokens(pacing.WithModelName(ctx, "m"), pacing.Tokens{Input: 1000, Output: 1000})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		return rt.RoundTrip(req)
	}

	t.Run("ended before it was handed over", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		var settled []pacing.Settlement
		ctx = pacing.WithTrace(ctx, &pacing.Trace{Admitted: func(pacing.Admission) { cancel() },
			Settled: func(st pacing.Settlement) { settled = append(settled, st) }})
		_, err := send(ctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, slots.ErrNotSent, "no refusal of the base's: the context's error, as net/http's")
		assert.Zero(t, hits.Load(), "nothing reached the upstream")
		assert.Equal(t, map[string]int{"tokens_per_minute//": 10000, "max_requests_per_minute//": 10}, budgetsLeft(gate))
		assert.Equal(t, []pacing.Settlement{{}}, settled, "settled once, unserved")
		assert.Zero(t, gate.Status().InFlight, "no linger: nothing was sent")
	})

	t.Run("ended waiting for a connection", func(t *testing.T) {
		first, err := send(t.Context()) // holds the one connection
		require.NoError(t, err)
		defer first.Body.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, err = send(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.NotErrorIs(t, err, slots.ErrNotSent)
		assert.Equal(t, int32(1), hits.Load(), "the second never reached the upstream")
		assert.Equal(t, map[string]int{"tokens_per_minute//": 8000, "max_requests_per_minute//": 9}, budgetsLeft(gate),
			"the first one's estimate only")
		assert.Equal(t, 1, gate.Status().InFlight, "the first one's slot only: no linger for the second")
	})
}

// A request net/http never had a connection for is answered by a proxy as
// an upstream's failure, not as a refusal of the Gate's: a failed TLS
// handshake is a 502, and it charges nothing. (Marking such requests with
// slots.ErrNotSent made it a 503 "could not be admitted"; found by
// review.)
func TestTransportUnconnectedIsTheUpstreamsFailure(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 10, BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 10}})
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = pacing.NewTransport(&http.Transport{}, gate) // does not trust the server's certificate
	rp.ErrorHandler = slots.ProxyErrorHandler()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"model":"m"}`))
	rp.ServeHTTP(rec, req.WithContext(pacing.WithModelName(req.Context(), "m")))
	assert.Equal(t, http.StatusBadGateway, rec.Code)
	assert.Equal(t, map[string]int{"max_requests_per_minute//": 10}, budgetsLeft(gate), "never sent: nothing charged")
}

// A request written on a reused connection that breaks, which net/http
// then tries again on a new one whose dial fails, may have reached the
// upstream: it stays charged, and with a linger its slot is kept for it,
// as a cut's. (Any dial error was taken for a request never sent; found
// by review, each.)
func TestTransportRetryDialAfterSending(t *testing.T) {
	for _, linger := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprint("linger ", linger), func(t *testing.T) {
			var hits atomic.Int32
			var srv *httptest.Server
			srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if hits.Add(1) == 1 {
					w.Header().Set("Content-Type", "application/json")
					_, _ = w.Write([]byte(`{}`))
					return
				}
				srv.Listener.Close() // the retry's dial is refused
				if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
					c.Close() // read, then gone without an answer
				}
			}))
			defer srv.Close()
			gate := tGate(t, pacing.Config{MaxConcurrentRequests: 10, BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 10}})
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			rt := pacing.NewTransport(base, gate, pacing.WithCutLinger(linger))
			send := func(key string) (*http.Response, error) {
				req, err := http.NewRequestWithContext(pacing.WithModelName(t.Context(), "m"), http.MethodPost, srv.URL, strings.NewReader(`{"model":"m"}`))
				require.NoError(t, err)
				if key != "" {
					req.Header.Set("Idempotency-Key", key) // net/http may send it again
				}
				return rt.RoundTrip(req)
			}
			resp, err := send("")
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			require.NoError(t, resp.Body.Close())
			require.Zero(t, gate.Status().InFlight)
			_, err = send("k1")
			var op *net.OpError
			require.ErrorAs(t, err, &op)
			require.Equal(t, "dial", op.Op, "net/http tried it again on a new connection, whose dial failed")
			require.Equal(t, int32(2), hits.Load(), "the upstream read the second request")
			assert.Equal(t, map[string]int{"max_requests_per_minute//": 8}, budgetsLeft(gate), "both reached the upstream")
			if linger > 0 {
				assert.Equal(t, 1, gate.Status().InFlight, "it may have been sent: held for the linger")
			} else {
				assert.Zero(t, gate.Status().InFlight)
			}
		})
	}
}

// A 101 that a ReverseProxy cannot switch to is closed by
// slots.ProxyErrorHandler through a pacing Transport too (it finds the
// connection by the request's context, which the Transport wraps): the
// Gate's slot goes (found by a bug hunt, on the slots Transport).
func TestTransportUpgradeDroppedByTheProxyFreesItsSlot(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: other\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(io.Discard, conn)
	}))
	defer up.Close()
	u, err := url.Parse(up.URL)
	require.NoError(t, err)
	gate := tGate(t, pacing.Config{MaxConcurrentRequests: 1})
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = pacing.NewTransport(base, gate, pacing.WithModel(func(*http.Request) string { return "m" }))
	rp.ErrorHandler = slots.ProxyErrorHandler()
	gw := httptest.NewServer(rp)
	defer gw.Close()
	req, err := http.NewRequest(http.MethodGet, gw.URL+"/ws", nil)
	require.NoError(t, err)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	resp, err := http.DefaultTransport.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	require.Eventually(t, func() bool { return gate.Status().InFlight == 0 }, 5*time.Second, time.Millisecond, "the Gate's slot freed")
}
