package slots_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// closeCountedBody counts its Close calls; once closed, a Read fails, as
// net/http's body's does.
type closeCountedBody struct {
	io.Reader
	closes atomic.Int32
}

func (b *closeCountedBody) Read(p []byte) (int, error) {
	if b.closes.Load() > 0 {
		return 0, errors.New("read on a closed body")
	}
	return b.Reader.Read(p)
}

func (b *closeCountedBody) Close() error { b.closes.Add(1); return nil }

// With leak detection, a body read to its end stops the watch of the
// request's context before it ends the exchange's own context (the one
// the watch is on): the other way round, ending that context would set
// the watch off on a body that is not cut. The watch would then close the
// base body under the reader, and mark the body cut, so that a Read after
// the end returned the context's cause, nil here: (0, nil), on which a
// reading loop spins for good.
func TestTransportBodyAtItsEndIsNotCutByItsOwnWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := leakLimiter()
		body := &closeCountedBody{Reader: strings.NewReader("all")}
		tr := slots.NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Header: http.Header{}, ContentLength: -1, Body: body, Request: r}, nil
		}), func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/", nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, "all", string(got))
		synctest.Wait() // a watch set off would have run by now
		assert.Zero(t, body.closes.Load(), "the base body closed before the caller closed it")
		n, err := resp.Body.Read(make([]byte, 8))
		assert.Zero(t, n)
		assert.ErrorIs(t, err, io.EOF, "a Read after the end")
		assert.Zero(t, lim.InFlight(), "the slot went at the end")
		require.NoError(t, resp.Body.Close())
		assert.Equal(t, int32(1), body.closes.Load(), "the caller's Close")
	})
}
