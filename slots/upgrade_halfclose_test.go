package slots_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// An upgraded connection through a ReverseProxy whose Transport is a
// slots.Transport can be half-closed: the client sends, half-closes, and
// still gets the backend's last words, as through net/http's Transport
// alone; the slot goes once the connection closes. Before, the wrapped
// connection lacked CloseWrite: the proxy tore both connections down at
// the client's half-close, and the client got nothing (found by a bug
// hunt).
func TestUpgradeHalfCloseThroughAProxy(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		got, _ := io.ReadAll(brw) // until the client's half-close
		fmt.Fprintf(conn, "%sbye\n", got)
	}))
	t.Cleanup(up.Close)
	lim := slots.NewLimiter(1)
	conn, br := upgradeThroughProxy(t, up, lim)
	assert.Equal(t, 1, lim.InFlight(), "held by the upgraded connection")
	fmt.Fprint(conn, "hello\n")
	require.NoError(t, conn.(*net.TCPConn).CloseWrite())
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	rest, _ := io.ReadAll(br)
	assert.Equal(t, "hello\nbye\n", string(rest), "the backend's answer after the half-close")
	require.Eventually(t, func() bool { return lim.InFlight() == 0 }, 5*time.Second, time.Millisecond,
		"freed once the connection closed")
}

// An upgraded connection whose backend half-closes first keeps its slot
// while the client may still send and the backend reads: the end of the
// backend's side is not the end of the connection, which the upstream
// counts until it closes. Before, the slot went back as the proxy read the
// backend's EOF, and a second connection could be admitted while the
// backend still held the first open. A connection closed after both
// sides are done is no cut: the linger does not hold its slot.
func TestUpgradeBackendHalfCloseKeepsTheSlot(t *testing.T) {
	open := make(chan struct{}) // the backend is reading what the client sends
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nhello\n")
		_ = brw.Flush()
		_ = conn.(*net.TCPConn).CloseWrite() // done sending
		close(open)
		got, _ := io.ReadAll(brw) // still reading, until the client's half-close
		if string(got) != "more\n" {
			t.Errorf("the backend read %q after its half-close", got)
		}
	}))
	t.Cleanup(up.Close)
	lim := slots.NewLimiter(1)
	conn, br := upgradeThroughProxy(t, up, lim, slots.WithLinger(time.Hour))
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, err := io.ReadAll(br) // the backend's half-close, passed on by the proxy
	require.NoError(t, err)
	assert.Equal(t, "hello\n", string(got))
	<-open
	assert.Equal(t, 1, lim.InFlight(), "the backend still reads: the connection is open")
	if s, err := lim.TryAcquire(); assert.ErrorIs(t, err, slots.ErrLimitReached, "no second connection while the first is open") == false {
		s.Release()
	}
	fmt.Fprint(conn, "more\n")
	require.NoError(t, conn.(*net.TCPConn).CloseWrite())
	require.Eventually(t, func() bool { return lim.InFlight() == 0 }, 5*time.Second, time.Millisecond,
		"freed once the connection closed: its end, not a cut (no linger)")
}

// upgradeThroughProxy upgrades a raw client connection to up through a
// ReverseProxy whose Transport (with opts) admits by lim.TryAcquire, and
// returns it, with its reader past the 101. All of it is closed at the
// test's end.
func upgradeThroughProxy(t *testing.T, up *httptest.Server, lim *slots.Limiter, opts ...slots.TransportOption) (net.Conn, *bufio.Reader) {
	t.Helper()
	target, err := url.Parse(up.URL)
	require.NoError(t, err)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	gw := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: slots.NewTransport(base, func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() }, opts...)})
	t.Cleanup(gw.Close)
	conn, err := net.Dial("tcp", gw.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	fmt.Fprint(conn, "GET /x HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	return conn, br
}
