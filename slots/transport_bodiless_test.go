package slots_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// An answer that HTTP says has no body (to HEAD; 204; 304) is complete as
// it comes: its slot goes at once, before the body is closed, over HTTP/1
// and HTTP/2 alike. (HTTP/2 gives such answers a Body that is not
// http.NoBody, so that a caller that did not close it held its slot.)
func TestTransportBodilessAnswersFreeAtOnce(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			status, _ := strconv.Atoi(r.URL.Query().Get("status"))
			w.WriteHeader(status)
			w.Write([]byte(r.URL.Query().Get("body"))) // none where HTTP has none
		}))
		up.EnableHTTP2 = h2
		up.StartTLS()
		t.Cleanup(up.Close)
		lim := slots.NewLimiter(1)
		client := &http.Client{Transport: slots.NewTransport(up.Client().Transport, func(*http.Request) (*slots.Slot, error) { return lim.TryAcquire() })}
		for _, tc := range []struct {
			method string
			status int
		}{{http.MethodHead, 200}, {http.MethodHead, 429}, {http.MethodGet, 204}, {http.MethodGet, 304}} {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, up.URL+"/?status="+strconv.Itoa(tc.status), nil)
			require.NoError(t, err)
			resp, err := client.Do(req)
			require.NoError(t, err)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Zero(t, lim.InFlight(), "HTTP/2 %v, %s %d: freed before the body is closed", h2, tc.method, tc.status)
			require.NoError(t, resp.Body.Close())
		}
		// An answer with a body keeps its slot until it is closed.
		resp, err := client.Get(up.URL + "/?status=200&body=x")
		require.NoError(t, err)
		assert.Equal(t, 1, lim.InFlight())
		require.NoError(t, resp.Body.Close())
		assert.Zero(t, lim.InFlight())
		assert.Zero(t, lim.Stats().DoubleReleases)
	}
}
