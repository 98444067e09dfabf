package slots_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// eofBody is a response body that is already at its end. It has no state,
// so putting it in an io.ReadCloser allocates nothing.
type eofBody struct{}

func (eofBody) Read([]byte) (int, error) { return 0, io.EOF }
func (eofBody) Close() error             { return nil }

// stubRoundTripper answers every request at once with an empty 200, without
// a network, so that what a wrapper adds can be counted exactly.
type stubRoundTripper struct{}

func (stubRoundTripper) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Body: eofBody{}}, nil
}

// roundTripAllocs counts the allocations of one complete use of rt: the
// round trip, reading the body to its end, and closing it.
func roundTripAllocs(t *testing.T, rt http.RoundTripper, req *http.Request) float64 {
	t.Helper()
	var buf [16]byte
	return testing.AllocsPerRun(1000, func() {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			panic(err)
		}
		for {
			if _, err := resp.Body.Read(buf[:]); err != nil {
				break
			}
		}
		resp.Body.Close()
	})
}

// TestTransportAllocs guards what the Transport adds per request over its
// base: the Slot and the body wrapper; and, when the request's context can
// end, the three allocations of the context.AfterFunc that frees the slot at
// that end (AfterFunc's context and stop func, and the func it is given).
// With WithLinger, the watch of the request's connection adds five: its
// record, its two hooks, the trace's context and the request's copy. With
// leak detection, the Slot's tracked record and its cleanup, the weak
// watch, the exchange's own context that a reclaim cancels (with the
// request's copy), the reclaim's cut (which frees the slot after the
// linger, as a cut's) and the response's copy come to 12 in all, 20 when
// the context can end: the watch is then on the exchange's own context, so
// that a reclaim's cancel of it takes the watch off the caller's context
// too, and that context's first child makes its map of children (net/http's
// Transport makes one of its own there: through it, the watch costs no more
// than on the caller's context).
func TestTransportAllocs(t *testing.T) {
	lim := slots.NewLimiter(8)
	admit := func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }
	tr := slots.NewTransport(stubRoundTripper{}, admit)
	lingering := slots.NewTransport(stubRoundTripper{}, admit, slots.WithLinger(time.Second))
	tracking := slots.NewLimiter(8, slots.WithLeakDetection())
	tracked := slots.NewTransport(stubRoundTripper{}, func(r *http.Request) (*slots.Slot, error) { return tracking.Acquire(r.Context()) })

	cancelable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		body  string // "server": a body of known length, as a server hands it on; "memory": a client's own; "linger": none, WithLinger; "leak": none, leak detection
		extra float64
	}{
		{"context that cannot end", context.Background(), "", 2},
		{"context that can end", cancelable, "", 5},
		{"a server's body of known length", context.Background(), "server", 4},
		{"a body in memory", context.Background(), "memory", 2},
		{"with a linger", context.Background(), "linger", 7},
		{"with leak detection", context.Background(), "leak", 12},
		{"with leak detection, a context that can end", cancelable, "leak", 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(tc.ctx, http.MethodGet, "http://upstream.invalid/v1/models", nil)
			require.NoError(t, err)
			switch tc.body { // never read: the stub answers without it
			case "server":
				req.Method, req.Body, req.ContentLength = http.MethodPost, eofBody{}, 15
			case "memory":
				req, err = http.NewRequestWithContext(tc.ctx, http.MethodPost, "http://upstream.invalid/v1/chat/completions", strings.NewReader(`{"stream":true}`))
				require.NoError(t, err)
			}
			bare := roundTripAllocs(t, stubRoundTripper{}, req)
			rt := tr
			switch tc.body {
			case "linger":
				rt = lingering
			case "leak":
				rt = tracked
			}
			wrapped := roundTripAllocs(t, rt, req)
			assert.LessOrEqual(t, wrapped-bare, tc.extra, "bare %v, through the Transport %v", bare, wrapped)
			t.Logf("bare %v, through the Transport %v", bare, wrapped)
			assert.Equal(t, 0, lim.InFlight()+tracking.InFlight(), "every slot was freed")
		})
	}
}
