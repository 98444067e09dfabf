package slots_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// trailing starts a server over HTTP/1.1 or HTTP/2 whose answer ends with
// a trailer sent without notice, and returns it with its client transport.
func trailing(t *testing.T, h2 bool) (*httptest.Server, *http.Transport) {
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "data: done\n\n")
		w.(http.Flusher).Flush()
		w.Header().Set(http.TrailerPrefix+"X-Unannounced", "late")
	}))
	return up, startTLS(t, up, h2)
}

// eofHooked is a base that calls hook when its body first meets io.EOF,
// before handing the io.EOF on: the net/http body under it has set the
// response's Trailer by then.
type eofHooked struct {
	rt   http.RoundTripper
	hook func()
}

func (h eofHooked) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := h.rt.RoundTrip(req)
	if err == nil {
		resp.Body = &hookedBody{ReadCloser: resp.Body, hook: h.hook}
	}
	return resp, err
}

type hookedBody struct {
	io.ReadCloser
	hook func()
	done bool
}

func (b *hookedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.hook()
	}
	return n, err
}

// A caller who reads the body to io.EOF while the request's context ends
// (a timeout, a proxy's client going away) sees the Trailer the base had
// set by then, as with the base alone, though the watch's cut won the
// body's end (before, the copy took it only at a clean end, and never
// did).
func TestTransportTrailerWhenTheContextEndsAtEOF(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "h1", true: "h2"}[h2], func(t *testing.T) {
			up, base := trailing(t, h2)
			lim := slots.NewLimiter(1, slots.WithLeakDetection())
			run := func(wrap func(http.RoundTripper) http.RoundTripper, ended func() bool) http.Header {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				rt := wrap(eofHooked{rt: base, hook: func() {
					cancel() // the context ends as the last Read returns
					require.Eventually(t, ended, 10*time.Second, time.Millisecond)
				}})
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, up.URL, nil)
				require.NoError(t, err)
				resp, err := rt.RoundTrip(req)
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err, "the caller read to io.EOF")
				assert.Equal(t, "data: done\n\n", string(body))
				_ = resp.Body.Close()
				return resp.Trailer
			}
			alone := run(func(rt http.RoundTripper) http.RoundTripper { return rt }, func() bool { return true })
			require.Equal(t, "late", alone.Get("X-Unannounced"), "the base alone")
			through := run(func(rt http.RoundTripper) http.RoundTripper {
				return slots.NewTransport(rt, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			}, func() bool { return lim.InFlight() == 0 }) // the watch's cut has ended the body
			assert.Equal(t, alone, through, "read to io.EOF, as with the base alone")
		})
	}
}

// A Trailer the caller set on the response before reading (a
// ReverseProxy's ModifyResponse announcing its own trailer, say) is kept,
// with the answer's trailers merged into it, as net/http does (before, the
// copy replaced it with the base's at the body's end).
func TestTransportTrailerSetByTheCallerIsKept(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "h1", true: "h2"}[h2], func(t *testing.T) {
			up, base := trailing(t, h2)
			lim := slots.NewLimiter(1, slots.WithLeakDetection())
			rt := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			get := func(rt http.RoundTripper) http.Header {
				req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, up.URL, nil)
				require.NoError(t, err)
				resp, err := rt.RoundTrip(req)
				require.NoError(t, err)
				resp.Trailer = http.Header{"X-Mine": {"mine"}}
				_, err = io.Copy(io.Discard, resp.Body)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				return resp.Trailer
			}
			alone := get(base)
			require.Equal(t, "mine", alone.Get("X-Mine"), "the base alone")
			require.Equal(t, "late", alone.Get("X-Unannounced"), "the base alone")
			assert.Equal(t, alone, get(rt))
			assert.Zero(t, lim.InFlight())
		})
	}
}

// connLikeBody is a base's body with Write and CloseWrite on a response that
// is not a 101 (a custom base's tunnel, say): the Transport marks it a conn,
// whose io.EOF does not end it; only Close does.
type connLikeBody struct {
	r    *strings.Reader
	resp *http.Response
}

func (c *connLikeBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF {
		c.resp.Trailer = http.Header{"X-Done": {"yes"}} // as net/http sets it, before the io.EOF
	}
	return n, err
}
func (c *connLikeBody) Write(p []byte) (int, error) { return len(p), nil }
func (c *connLikeBody) CloseWrite() error           { return nil }
func (c *connLikeBody) Close() error                { return nil }

type connLikeBase struct{}

func (connLikeBase) RoundTrip(req *http.Request) (*http.Response, error) {
	resp := &http.Response{StatusCode: http.StatusOK, Request: req, Header: http.Header{}}
	resp.Body = &connLikeBody{r: strings.NewReader("tunnel"), resp: resp}
	return resp, nil
}

// For such a body the clean end is reached on the watch's goroutine (cut
// with drained) when the context ends: the copy's Trailer is taken at its
// io.EOF, on the reader's goroutine, not there (before, it was written
// there, racing with the caller under -race, and was missing between
// io.EOF and Close).
func TestTransportTrailerOfAConnLikeBody(t *testing.T) {
	lim := slots.NewLimiter(1, slots.WithLeakDetection())
	rt := slots.NewTransport(connLikeBase{}, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.invalid/", nil)
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "yes", resp.Trailer.Get("X-Done"), "read to io.EOF: the base's Trailer is set")
	cancel() // the watch closes the body: drained, so end(endClean, fromWatch=true)
	var seen atomic.Int64
	require.Eventually(t, func() bool {
		if resp.Trailer != nil { // the caller looks, as the watch writes
			seen.Add(1)
		}
		return lim.InFlight() == 0
	}, 10*time.Second, time.Microsecond)
}
