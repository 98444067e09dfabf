package slots_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// A dropped stream is reclaimed, and its exchange ended at the
// upstream, in more variants than TestTransportLeakedStreamIsClosed: an
// opaque context, a POST with a body (in memory, of known length without
// GetBody as a server's, streamed and still open), a response of declared
// length, a gzip'd one (the h1/h2 clients wrap it), WithLinger. A request
// body still open is closed by the reclaim: net/http's HTTP/2 client does
// not end a stream whose request body's Read is blocked when its context
// ends (before, that stream went on after its slot was reclaimed).
func TestTransportLeakedStreamVariants(t *testing.T) {
	type variant struct {
		name     string
		ctx      func(t *testing.T) context.Context
		combined bool
		method   string
		body     func(t *testing.T) (io.Reader, int64, bool) // reader, length, keep GetBody
		length   bool                                        // response with Content-Length
		gzip     bool
		linger   bool
		timeout  bool
	}
	canEnd := func(t *testing.T) context.Context { return t.Context() }
	vs := []variant{
		{name: "can end", ctx: canEnd},
		{name: "cannot end", ctx: func(*testing.T) context.Context { return context.Background() }},
		{name: "opaque", ctx: func(t *testing.T) context.Context { return opaqueContext{t.Context()} }},
		{name: "combined, cannot end", ctx: func(*testing.T) context.Context { return context.Background() }, combined: true},
		{name: "POST in memory", ctx: canEnd, method: http.MethodPost, body: func(*testing.T) (io.Reader, int64, bool) {
			return bytes.NewReader([]byte(`{"stream":true}`)), 15, true
		}},
		{name: "POST known length, no GetBody", ctx: canEnd, method: http.MethodPost, body: func(*testing.T) (io.Reader, int64, bool) {
			return io.NopCloser(bytes.NewReader([]byte(`{"stream":true}`))), 15, false
		}},
		{name: "POST streamed, still open", ctx: canEnd, method: http.MethodPost, body: func(t *testing.T) (io.Reader, int64, bool) {
			pr, pw := io.Pipe()
			t.Cleanup(func() { pw.Close() })
			go func() { _, _ = pw.Write([]byte("first part")) }()
			return pr, -1, false
		}},
		{name: "Content-Length", ctx: canEnd, length: true},
		{name: "Content-Length, cannot end", ctx: func(*testing.T) context.Context { return context.Background() }, length: true},
		{name: "gzip", ctx: canEnd, gzip: true},
		{name: "linger", ctx: canEnd, linger: true},
		// (a client with a Timeout passed too: not kept, as net/http's timer
		// goroutine for a dropped body stays until the timeout, for goleak)
	}
	for _, h2 := range []bool{false, true} {
		for _, v := range vs {
			t.Run(map[bool]string{false: "h1", true: "h2"}[h2]+"/"+v.name, func(t *testing.T) {
				var open, came atomic.Int64
				up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					_ = http.NewResponseController(w).EnableFullDuplex() // h1: answer while the request body is still open
					came.Add(1)
					open.Add(1)
					defer open.Add(-1)
					if v.length {
						w.Header().Set("Content-Length", strconv.Itoa(1<<30))
					}
					var out io.Writer = w
					var flush = func() { w.(http.Flusher).Flush() }
					if v.gzip {
						w.Header().Set("Content-Encoding", "gzip")
						zw := gzip.NewWriter(w)
						out = zw
						flush = func() { _ = zw.Flush(); w.(http.Flusher).Flush() }
					}
					streamUntilGone(r, out, flush)
				}))
				base := startTLS(t, up, h2)
				quiet := slots.WithLogger(slog.New(slog.DiscardHandler))
				a, b := slots.NewLimiter(1, slots.WithLeakDetection(), quiet), slots.NewLimiter(1, slots.WithLeakDetection(), quiet)
				admit := func(r *http.Request) (*slots.Slot, error) {
					s, err := a.Acquire(r.Context())
					if err != nil || !v.combined {
						return s, err
					}
					s2, err := b.Acquire(r.Context())
					if err != nil {
						return nil, err
					}
					return slots.Combine(s, s2), nil
				}
				var opts []slots.TransportOption
				if v.linger {
					opts = append(opts, slots.WithLinger(time.Millisecond))
				}
				client := &http.Client{Transport: slots.NewTransport(base, admit, opts...)}
				if v.timeout {
					client.Timeout = time.Hour
				}
				func() {
					method := v.method
					if method == "" {
						method = http.MethodGet
					}
					var body io.Reader
					var n int64
					keep := true
					if v.body != nil {
						body, n, keep = v.body(t)
					}
					req, err := http.NewRequestWithContext(v.ctx(t), method, up.URL, body)
					require.NoError(t, err)
					if v.body != nil {
						req.ContentLength = n
						if !keep {
							req.GetBody = nil
						}
					}
					resp, err := client.Do(req)
					require.NoError(t, err)
					require.Equal(t, map[bool]int{false: 1, true: 2}[h2], resp.ProtoMajor)
					_ = resp // dropped
				}()
				require.Eventually(t, func() bool { return came.Load() == 1 }, 10*time.Second, time.Millisecond)
				require.Eventually(t, func() bool {
					runtime.GC()
					return a.Stats().Leaked == 1 && a.InFlight() == 0 && b.InFlight() == 0
				}, 10*time.Second, time.Millisecond, "reclaimed")
				require.Eventually(t, func() bool { return open.Load() == 0 }, 10*time.Second, time.Millisecond, "stream ended")
			})
		}
	}
}
