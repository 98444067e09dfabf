package pacing_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
)

// A 101 that a ReverseProxy cannot switch to, with an ErrorHandler of the
// program's own, is closed by the slots Transport a second after the
// server's request ended, through a pacing Transport too, and though the
// garbage collector runs meanwhile: the Gate's slot goes. Found by review:
// a collection within the second left it held for good.
func TestTransportUpgradeDroppedUnderAnErrorHandlerOfItsOwn(t *testing.T) {
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
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
		http.Error(w, err.Error(), http.StatusBadGateway)
	}
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
	require.Eventually(t, func() bool {
		runtime.GC() // some fifty collections within the second
		return gate.Status().InFlight == 0
	}, 5*time.Second, 20*time.Millisecond, "the Gate's slot freed")
}
