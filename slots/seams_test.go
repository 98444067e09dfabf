package slots_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/slots"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// ownDoneCtx has a Done channel of its own, so context.AfterFunc has to
// start a goroutine to watch it.
type ownDoneCtx struct {
	context.Context
	done chan struct{}
}

func (c ownDoneCtx) Done() <-chan struct{} { return c.done }

func TestTransportOddPartners(t *testing.T) {
	t.Run("a RoundTripper answering (nil, nil) is an error and frees the slot", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil }),
			func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		assert.Error(t, err)
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("a response that comes with an error is closed and the slot freed", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		body := &recordingBody{Reader: strings.NewReader("partial")}
		tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: body}, errors.New("broken")
		}), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		_, err := tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		assert.Error(t, err)
		assert.True(t, body.closed.Load())
		assert.Equal(t, 0, lim.InFlight())
	})
	t.Run("an admit that takes no slot leaves no context watch behind", func(t *testing.T) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		ctx := ownDoneCtx{Context: context.Background(), done: make(chan struct{})}
		defer close(ctx.done)
		tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok"))}, nil
		}), func(*http.Request) (*slots.Slot, error) { return nil, nil })
		req := httptest.NewRequest(http.MethodGet, "http://upstream/", nil).WithContext(ctx)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	})
	t.Run("an admit returning a slot and an error: the slot is released", func(t *testing.T) {
		lim := slots.NewLimiter(1)
		admit := func(*http.Request) (*slots.Slot, error) {
			s, _ := lim.TryAcquire()
			return s, errors.New("second stage refused")
		}
		_, err := slots.NewTransport(http.DefaultTransport, admit).RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
		assert.Error(t, err)
		assert.Equal(t, 0, lim.InFlight())

		h := slots.Middleware(admit)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, 0, lim.InFlight())
	})
}

// TestTransportUpgradeOutlivesItsContext: net/http hands an upgraded
// connection to the caller and does not close it when the request's context
// ends (a websocket dialer cancels its handshake timeout once connected), so
// the slot stays until the connection is closed.
func TestTransportUpgradeOutlivesItsContext(t *testing.T) {
	up, lim, rt := echoing(t)
	client := &http.Client{Transport: rt}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	resp, err := client.Do(upgradeRequest(t, ctx, up.URL, "echo"))
	require.NoError(t, err)
	require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode)
	cancel() // the handshake is done
	conn := resp.Body.(io.ReadWriteCloser)
	_, err = fmt.Fprint(conn, "hello\n")
	require.NoError(t, err)
	line, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "hello\n", line)
	assert.Equal(t, 1, lim.InFlight(), "the live connection keeps its slot")
	conn.Close()
	assert.Equal(t, 0, lim.InFlight())
}

type connLike struct{ *strings.Reader }

func (connLike) Write(p []byte) (int, error) { return len(p), nil }
func (connLike) Close() error                { return nil }

func TestWrapBodyKeepsWriteAndWriteTo(t *testing.T) {
	lim := slots.NewLimiter(1)
	s, _ := lim.TryAcquire()
	b := slots.WrapBody(connLike{strings.NewReader("x")}, s)
	_, w := b.(io.Writer)
	_, wt := b.(io.WriterTo)
	assert.True(t, w)
	assert.True(t, wt)
	b.Close()
}

func TestRetryAfterHuge(t *testing.T) {
	status, ra := slots.HTTPStatus(&slots.LimitError{Err: slots.ErrQueueFull, RetryAfter: math.MaxInt64})
	assert.Equal(t, http.StatusTooManyRequests, status)
	assert.Greater(t, ra, time.Duration(0), "no overflow into a negative value")
}

func TestWithRejectStatusChecksTheCode(t *testing.T) {
	assert.PanicsWithValue(t, "slots: WithRejectStatus(0): a rejection needs a 4xx or 5xx status", func() { slots.WithRejectStatus(0) })
	assert.NotPanics(t, func() { slots.WithRejectStatus(http.StatusServiceUnavailable) })
}

func TestTransportBasePanicFreesTheSlot(t *testing.T) {
	lim := slots.NewLimiter(1)
	tr := slots.NewTransport(roundTripFunc(func(*http.Request) (*http.Response, error) { panic("base bug") }),
		func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
	assert.PanicsWithValue(t, "base bug", func() {
		_, _ = tr.RoundTrip(httptest.NewRequest(http.MethodGet, "http://upstream/", nil))
	})
	assert.Equal(t, 0, lim.InFlight())
}
