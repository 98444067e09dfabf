package slots_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"testing"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/slots"
)

// With leak detection, the reclaim of a response dropped unread, neither
// read nor closed, under a long-lived context takes the Transport's watch
// of that context's end off it too. Found by review: the watch was left
// on the caller's context until it ended, one for each dropped body,
// after its slot had been reclaimed (under a context of another library's,
// as here, a goroutine each; under a standard one, an entry each in its
// children).
func TestTransportReclaimTakesItsWatchOffTheContext(t *testing.T) {
	lim := leakLimiter()
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, ContentLength: -1,
			Body: io.NopCloser(strings.NewReader("streaming")), Request: r}, nil
	})
	tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := opaqueContext{parent}
	before := goleak.IgnoreCurrent()
	func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.invalid/v1", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		_ = resp // dropped
	}()
	collectUntil(t, func() bool { return lim.Stats().Leaked == 1 })
	waitFor(t, "the dropped slot freed", func() bool { return lim.InFlight() == 0 })
	goleak.VerifyNone(t, before)
}

// With leak detection, a base that panics leaves no context of the
// Transport's behind under the caller's, a long-lived one: the exchange's
// own context ends with its slot. Found by review: it was left there until
// the caller's context ended, one for each panic recovered above.
func TestTransportBasePanicLeavesNoContextBehind(t *testing.T) {
	lim := leakLimiter()
	tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) { panic("a base's bug") }),
		func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := opaqueContext{parent}
	before := goleak.IgnoreCurrent()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.invalid/v1", nil)
	require.NoError(t, err)
	assert.PanicsWithValue(t, "a base's bug", func() { _, _ = tr.RoundTrip(req) })
	assert.Zero(t, lim.InFlight(), "the slot is freed before the panic goes on")
	goleak.VerifyNone(t, before)
}

// With leak detection, a 101 that a ReverseProxy drops unused is found
// dropped, and its slot reclaimed, while its handler still runs (an
// ErrorHandler of the program's own that goes on after its answer, here):
// the check for a dropped upgraded connection, which waits for the end of
// the server's request, must not keep it. Found by review: that check's
// closure kept the body, and so its slot, until the request ended.
func TestUpgradeDroppedIsReclaimedWhileItsHandlerRuns(t *testing.T) {
	lim := slots.NewLimiter(1, slots.WithLeakDetection(), slots.WithLogger(slog.New(slog.DiscardHandler)))
	target := upgradingBackend(t, "other")
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	release := make(chan struct{})
	handlerDone := make(chan struct{})
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		// The Transport's clock never moves: only leak detection can free the slot.
		Transport: slots.NewTransport(base, func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() }, slots.WithClock(clock.NewMock())),
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			defer close(handlerDone)
			http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
			w.(http.Flusher).Flush()
			<-release // the handler goes on with other work
		}}
	gw := httptest.NewServer(rp)
	t.Cleanup(gw.Close)
	t.Cleanup(func() { close(release); <-handlerDone }) // first: the handler ends
	conn, err := net.Dial("tcp", gw.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close() // open until the end: the server's request goes on
	fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	// The leak is counted just before its slot is freed: wait for both,
	// with the handler still held on release.
	collectUntil(t, func() bool { return lim.Stats().Leaked == 1 && lim.InFlight() == 0 })
	select {
	case <-handlerDone:
		t.Fatal("the handler ended before the slot was reclaimed")
	default:
	}
}
