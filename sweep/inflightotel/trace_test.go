package inflightotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// Requests through a real pacing.Transport, each with its Cap's Trace: the
// admission and the refusal are counted by result and priority and put on
// the request's trace as a child span each, and a release is measured
// once the stream has ended.
func TestCapTraceThroughATransport(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-release
	}))
	defer up.Close()
	gate, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1, MaxQueueWaitMS: 30})
	require.NoError(t, err)
	defer gate.Close()
	rt := pacing.NewTransport(up.Client().Transport, gate)
	m := newMeters(t)
	c, err := inflightotel.New("provider", inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	sr, tp := tracing(t)

	send := func() (*http.Response, error) {
		ctx, span := tp.Tracer("test").Start(context.Background(), "request")
		defer span.End()
		ctx = slots.WithPriority(ctx, slots.PriorityInteractive)
		ctx = pacing.WithTrace(ctx, c.Trace(ctx))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		return rt.RoundTrip(req)
	}
	resp, err := send()
	require.NoError(t, err)
	_, err = send() // waits its 30 ms behind the first, in vain
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	close(release)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())

	got := m.collect(t)
	assert.Equal(t, map[string]int64{
		"inflight.cap=provider,inflight.priority=interactive,inflight.result=acquired":     1,
		"inflight.cap=provider,inflight.priority=interactive,inflight.result=wait_timeout": 1,
	}, ints(t, got["inflight.requests"]))
	n, sum := counts(t, got["inflight.request.time_in_queue"])
	assert.Equal(t, uint64(1), n["inflight.cap=provider,inflight.priority=interactive,inflight.result=wait_timeout"])
	assert.GreaterOrEqual(t, sum["inflight.cap=provider,inflight.priority=interactive,inflight.result=wait_timeout"], 0.03, "waited its 30 ms")
	n, _ = counts(t, got["inflight.slot.duration"])
	assert.Equal(t, map[string]uint64{"inflight.cap=provider": 1}, n, "the stream's slots, released once")

	var results []string
	for _, sp := range sr.Ended() {
		if sp.Name() == "acquire provider" {
			results = append(results, attrMap(sp.Attributes())["inflight.result"])
			if sp.Status().Code == codes.Error {
				assert.Contains(t, sp.Status().Description, slots.ErrWaitTimeout.Error())
			}
		}
	}
	assert.ElementsMatch(t, []string{"acquired", "wait_timeout"}, results, "each wait on its request's trace")
}
