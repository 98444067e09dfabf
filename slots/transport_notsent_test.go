package slots_test

import (
	"context"
	"errors"
	"fmt"
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

type countingBody struct {
	closes atomic.Int32
}

func (b *countingBody) Read([]byte) (int, error) { return 0, errors.New("never read") }
func (b *countingBody) Close() error             { b.closes.Add(1); return nil }

func notSentReq(ctx context.Context) *http.Request {
	return httptest.NewRequest(http.MethodPost, "http://upstream/", strings.NewReader("hello")).WithContext(ctx)
}

func notSentLimit() *slots.LimitError {
	return &slots.LimitError{Err: errors.New("over budget"), Cap: "budget", RetryAfter: 3 * time.Second}
}

// A base that returns ErrNotSent with a response (and a body): the body is
// closed once, the slot freed at once and exactly once, no linger.
func TestTransportNotSentWithAResponse(t *testing.T) {
	lim := slots.NewLimiter(1)
	body := &countingBody{}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: body, Header: http.Header{}}, fmt.Errorf("%w: %w", slots.ErrNotSent, notSentLimit())
	})
	tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }, slots.WithLinger(time.Hour))
	resp, err := tr.RoundTrip(notSentReq(context.Background()))
	assert.Nil(t, resp)
	require.ErrorIs(t, err, slots.ErrNotSent)
	assert.Equal(t, int32(1), body.closes.Load())
	assert.Equal(t, 0, lim.InFlight())
	assert.Zero(t, lim.Stats().DoubleReleases)
	w := httptest.NewRecorder()
	slots.ProxyErrorHandler()(w, notSentReq(context.Background()), err)
	assert.Equal(t, 429, w.Code)
	assert.Equal(t, "3", w.Header().Get("Retry-After"))
}

// Under WithoutSlot a base's refusal is a refusal too: ProxyErrorHandler
// answers it as one (429), not as the upstream's failure (502).
func TestTransportNotSentWithoutSlotIsARefusal(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return nil, fmt.Errorf("%w: %w", slots.ErrNotSent, notSentLimit())
	})
	tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return slots.NewLimiter(1).Acquire(r.Context()) })
	ctx := slots.WithoutSlot(context.Background())
	_, err := tr.RoundTrip(notSentReq(ctx))
	require.ErrorIs(t, err, slots.ErrNotSent)
	w := httptest.NewRecorder()
	slots.ProxyErrorHandler()(w, notSentReq(ctx), err)
	assert.Equal(t, http.StatusTooManyRequests, w.Code, "%s", w.Body)
}

// ErrNotSent with no *LimitError (a breaker's "open", say) is answered
// 503, not 500 as an unknown error is.
func TestTransportNotSentWithoutALimitError(t *testing.T) {
	for _, cause := range []error{slots.ErrNotSent, fmt.Errorf("%w: circuit open", slots.ErrNotSent)} {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) { return nil, cause })
		lim := slots.NewLimiter(1)
		tr := slots.NewTransport(base, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		_, err := tr.RoundTrip(notSentReq(context.Background()))
		w := httptest.NewRecorder()
		slots.ProxyErrorHandler()(w, notSentReq(context.Background()), err)
		assert.Equal(t, http.StatusServiceUnavailable, w.Code, "%v: %s", cause, w.Body)
		st, _ := slots.HTTPStatus(err)
		assert.Equal(t, http.StatusServiceUnavailable, st, "HTTPStatus(%v)", cause)
		assert.Zero(t, lim.InFlight())
	}
}

// A slots.Transport as the base of another: the inner one's refusal is a
// request not sent (ErrNotSent), so the outer frees its slot at once.
func TestTransportInnerRefusalIsNotSent(t *testing.T) {
	inner := slots.NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) { panic("not reached") }),
		func(r *http.Request) (*slots.Slot, error) { return nil, notSentLimit() })
	lim := slots.NewLimiter(1)
	outer := slots.NewTransport(inner, func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }, slots.WithLinger(time.Hour))
	_, err := outer.RoundTrip(notSentReq(context.Background()))
	require.Error(t, err)
	assert.ErrorIs(t, err, slots.ErrNotSent, "an inner Transport's refusal is a request not sent")
	assert.Equal(t, 0, lim.InFlight(), "freed at once")
}
