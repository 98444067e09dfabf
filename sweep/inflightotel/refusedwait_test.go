package inflightotel_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// slowBody is a request body that takes d to arrive (a slow client's
// upload), in the bubble's time.
type slowBody struct {
	d    time.Duration
	done bool
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	time.Sleep(b.d)
	b.done = true
	return copy(p, `{"model":"m"}`), nil
}

func (b *slowBody) Close() error { return nil }

// A request refused after waiting its 30 ms has its time in queue
// measured as an admitted one's is: from the start of its wait
// (pacing.Trace.Waiting), not from the Trace's making, before the
// Transport read the body for the model. Before, the refusal took in the
// body's second of upload (1.03 s recorded), while an admission did not.
func TestRefusedWaitIsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 30})
		require.NoError(t, err)
		defer gate.Close()
		release := make(chan struct{})
		rt := pacing.NewTransport(roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: io.NopCloser(&blocked{release}), Header: http.Header{}, Request: r}, nil
		}), gate)
		m := newMeters(t)
		c, err := inflightotel.New("provider", inflightotel.WithMeterProvider(m))
		require.NoError(t, err)
		send := func() (*http.Response, error) {
			ctx := context.Background()
			ctx = pacing.WithTrace(ctx, c.Trace(ctx))
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream/", &slowBody{d: time.Second})
			require.NoError(t, err)
			return rt.RoundTrip(req)
		}
		held, err := send()
		require.NoError(t, err)
		_, err = send()
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		close(release)
		_, _ = io.Copy(io.Discard, held.Body)
		held.Body.Close()

		_, sum := counts(t, m.collect(t)["inflight.request.time_in_queue"])
		assert.InDelta(t, 0, sum["inflight.cap=provider,inflight.priority=default,inflight.result=acquired"], 0.001, "admitted at once")
		assert.InDelta(t, 0.03, sum["inflight.cap=provider,inflight.priority=default,inflight.result=wait_timeout"], 0.001, "waited its 30 ms")
	})
}

// blocked is a body that ends once its channel is closed.
type blocked struct{ c chan struct{} }

func (b *blocked) Read([]byte) (int, error) { <-b.c; return 0, io.EOF }
