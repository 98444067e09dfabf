package slots_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/slots"
)

// countingContext is a context of another library's that implements
// AfterFunc itself: context.WithCancel and context.AfterFunc register with
// it, so that registrations still standing can be counted exactly.
type countingContext struct {
	context.Context
	live atomic.Int64
}

func (*countingContext) Value(any) any { return nil }

func (c *countingContext) AfterFunc(f func()) func() bool {
	c.live.Add(1)
	var once sync.Once
	stop := context.AfterFunc(c.Context, func() { once.Do(func() { c.live.Add(-1) }); f() })
	return func() bool {
		ok := stop()
		if ok {
			once.Do(func() { c.live.Add(-1) })
		}
		return ok
	}
}

// blockingBody blocks its Read until it is closed.
type blockingBody struct {
	once   sync.Once
	closed chan struct{}
}

func newBlockingBody() *blockingBody { return &blockingBody{closed: make(chan struct{})} }
func (b *blockingBody) Read([]byte) (int, error) {
	<-b.closed
	return 0, errors.New("closed")
}
func (b *blockingBody) Close() error { b.once.Do(func() { close(b.closed) }); return nil }

// With leak detection, every way an exchange ends leaves nothing
// registered on the caller's context (a body dropped and reclaimed, a
// base that panics: both left one there before), frees the slot once, and
// a body still in use is cut only when the caller's context ends.
func TestTransportLeakDetectionWatchPaths(t *testing.T) {
	type tc struct {
		name   string
		base   func(r *http.Request) (*http.Response, error)
		method string
		use    func(t *testing.T, resp *http.Response, cancel context.CancelFunc)
		err    bool
		panics bool
	}
	streaming := func(body io.ReadCloser) func(r *http.Request) (*http.Response, error) {
		return func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Header: http.Header{}, ContentLength: -1, Body: body, Request: r}, nil
		}
	}
	cases := []tc{
		{name: "read to EOF", base: streaming(io.NopCloser(strings.NewReader("all"))),
			use: func(t *testing.T, resp *http.Response, _ context.CancelFunc) {
				_, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
			}},
		{name: "closed early", base: streaming(newBlockingBody()),
			use: func(t *testing.T, resp *http.Response, _ context.CancelFunc) { require.NoError(t, resp.Body.Close()) }},
		{name: "read to EOF, then the context ends", base: streaming(io.NopCloser(strings.NewReader("all"))),
			use: func(t *testing.T, resp *http.Response, cancel context.CancelFunc) {
				_, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				cancel()
				require.NoError(t, resp.Body.Close())
			}},
		{name: "the context ends mid-stream", base: streaming(newBlockingBody()),
			use: func(t *testing.T, resp *http.Response, cancel context.CancelFunc) {
				done := make(chan error, 1)
				go func() { _, err := io.ReadAll(resp.Body); done <- err }()
				cancel() // before or during its Read: either is cut
				select {
				case err := <-done:
					assert.ErrorIs(t, err, context.Canceled)
				case <-time.After(5 * time.Second):
					t.Fatal("the watch never cut the stream")
				}
				require.NoError(t, resp.Body.Close())
			}},
		{name: "dropped", base: streaming(newBlockingBody()),
			use: func(t *testing.T, resp *http.Response, _ context.CancelFunc) {}},
		{name: "HEAD", method: http.MethodHead, base: streaming(http.NoBody)},
		{name: "base error", err: true, base: func(*http.Request) (*http.Response, error) { return nil, errors.New("boom") }},
		{name: "base panic", panics: true, base: func(*http.Request) (*http.Response, error) { panic("boom") }},
		{name: "101", base: func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 101, Header: http.Header{}, Body: &connLikeBody{}, Request: r}, nil
		}, use: func(t *testing.T, resp *http.Response, _ context.CancelFunc) { require.NoError(t, resp.Body.Close()) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lim := leakLimiter()
			tr := slots.NewTransport(roundTripFunc(c.base), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			ctx := &countingContext{Context: parent}
			before := goleak.IgnoreCurrent()
			method := c.method
			if method == "" {
				method = http.MethodGet
			}
			req, err := http.NewRequestWithContext(ctx, method, "http://upstream.invalid/v1", nil)
			require.NoError(t, err)
			if c.panics {
				assert.Panics(t, func() { _, _ = tr.RoundTrip(req) })
			} else {
				resp, err := tr.RoundTrip(req)
				if c.err {
					require.Error(t, err)
				} else {
					require.NoError(t, err)
					assert.Same(t, req, resp.Request)
					if c.use != nil {
						c.use(t, resp, cancel)
					}
				}
			}
			if c.name == "dropped" {
				collectUntil(t, func() bool { return lim.Stats().Leaked == 1 })
			}
			waitFor(t, "the slot freed", func() bool { return lim.InFlight() == 0 })
			assert.Zero(t, ctx.live.Load(), "registrations left on the caller's context")
			if c.name == "dropped" {
				collectUntil(t, func() bool { return lim.Stats().Leaked == 1 })
			} else {
				assert.Zero(t, lim.Stats().Leaked)
			}
			assert.Zero(t, lim.Stats().DoubleReleases)
			goleak.VerifyNone(t, before)
		})
	}
}
