package slots_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// A wait for admission ended by the server itself (its drain ends the
// waits: pacing.WithWaitContext), not by the client, is no "client closed
// request": the client is still there and reads the answer. Middleware and
// ProxyErrorHandler answered it 499, which says the client went away.
func TestCanceledWaitOfALiveClientIsNot499(t *testing.T) {
	lim := slots.NewLimiter(1)
	held, err := lim.TryAcquire()
	require.NoError(t, err)
	defer held.Release()
	drain, drained := context.WithCancel(context.Background())
	drained() // the server drains: every wait ends at once
	admit := func(*http.Request) (*slots.Slot, error) { return lim.Acquire(drain) }

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	target, err := url.Parse(up.URL)
	require.NoError(t, err)
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:    slots.NewTransport(nil, admit),
		ErrorHandler: slots.ProxyErrorHandler(),
	})
	t.Cleanup(proxy.Close)
	mw := httptest.NewServer(slots.Middleware(admit)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })))
	t.Cleanup(mw.Close)

	client := newClient(t)
	for name, u := range map[string]string{"ProxyErrorHandler": proxy.URL, "Middleware": mw.URL} {
		resp, err := client.Get(u)
		require.NoError(t, err, name)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.NotEqual(t, slots.StatusClientClosedRequest, resp.StatusCode, "%s: 499 sent to a client that is still there", name)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, name)
	}
	assert.Equal(t, 1, lim.InFlight(), "only the slot held by the test")
}
