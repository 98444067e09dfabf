package pacing_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A refusal names the cap that kept the request from starting, with that
// cap's figures, and the message a client is told says so.
func TestRefusalNamesItsCap(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      pacing.Config
		held     int // requests for model "m" holding their grants first
		cap      string
		inFlight int
		limit    int
		message  string
	}{
		{"the provider's cap", pacing.Config{MaxConcurrentRequests: 2}, 2, pacing.CapProvider, 2, 2,
			"too many requests in flight under the provider cap: 2 of 2, 0 queued (timed out waiting)"},
		{"the model's cap", pacing.Config{MaxConcurrentRequests: 5, Models: map[string]pacing.ModelConfig{"m": {MaxConcurrentRequests: 1}}}, 1, pacing.CapModel, 1, 1,
			"too many requests in flight under the model cap: 1 of 1, 0 queued (timed out waiting)"},
		{"the key pool", pacing.Config{MaxConcurrentRequests: 5, APIKeys: []pacing.KeyConfig{{ID: "a", MaxConcurrentRequests: 1}, {ID: "b", MaxConcurrentRequests: 2}}}, 3, pacing.CapAPIKey, 3, 3,
			"too many requests in flight under the api_key cap: 3 of 3, 0 queued (timed out waiting)"},
		{"the spacing of starts", pacing.Config{MaxConcurrentRequests: 5, RequestsPerMinute: 1}, 1, pacing.CapPacing, 1, 5,
			"waiting for the spacing of starts to the upstream: 1 in flight, 0 queued (timed out waiting)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				tc.cfg.MaxQueueWaitMS = 100
				gate, err := pacing.NewGate("p", tc.cfg)
				require.NoError(t, err)
				defer gate.Close()
				for range tc.held {
					gt, err := gate.Acquire(context.Background(), "m")
					require.NoError(t, err)
					defer gt.Slot.Release()
				}
				_, err = gate.Acquire(context.Background(), "m")
				var le *slots.LimitError
				require.ErrorAs(t, err, &le)
				require.ErrorIs(t, err, slots.ErrWaitTimeout)
				assert.Equal(t, tc.cap, le.Cap)
				assert.Equal(t, tc.inFlight, le.InFlight)
				assert.Equal(t, tc.limit, le.Limit)
				assert.Equal(t, tc.message, slots.ErrorMessage(err))
			})
		})
	}
}

// The error a caller logs names the cap that refused beside the Gate's key
// (the provider's and the request's model's name): before, a request for
// an uncapped model refused by the provider's cap read `key "p/other": 2 in
// flight, limit 2`, the provider's figures under the model's name.
func TestRefusalErrorNamesItsCap(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		gate, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 2, MaxQueueWaitMS: 100,
			Models: map[string]pacing.ModelConfig{"m": {MaxConcurrentRequests: 1}}})
		require.NoError(t, err)
		defer gate.Close()
		for _, model := range []string{"m", "other"} {
			gt, err := gate.Acquire(context.Background(), model)
			require.NoError(t, err)
			defer gt.Slot.Release()
		}
		_, err = gate.Acquire(context.Background(), "other")
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		assert.Contains(t, err.Error(), `(key "p/other", cap "provider": 2 in flight, limit 2, 0 queued`)
	})
}

// A refusal by a budget per minute tells the client what started in the
// last minute, not a count in flight: before, a request refused by
// max_requests_per_minute after the minute's one had ended read "too many
// requests in flight under the max_requests_per_minute cap: 1 of 1", with
// none in flight.
func TestRefusalByABudgetSaysSo(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		gate, err := pacing.NewGate("p", pacing.Config{BudgetLimits: pacing.BudgetLimits{MaxRequestsPerMinute: 1}, MaxQueueWaitMS: 100})
		require.NoError(t, err)
		defer gate.Close()
		gt, err := gate.Acquire(context.Background(), "m")
		require.NoError(t, err)
		gt.Slot.Release()
		_, err = gate.Acquire(context.Background(), "m")
		require.ErrorIs(t, err, pacing.ErrOverBudget)
		assert.Equal(t, "over the max_requests_per_minute budget: 1 of 1 requests started in the last minute", slots.ErrorMessage(err))
	})
}

// A full queue is the provider's: its bound, not a cap's count, refused.
func TestQueueFullIsTheProviders(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		gate, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 1})
		require.NoError(t, err)
		defer gate.Close()
		gt, err := gate.Acquire(context.Background(), "m")
		require.NoError(t, err)
		defer gt.Slot.Release()
		ctx, cancel := context.WithCancel(context.Background())
		waiting := make(chan error, 1)
		go func() {
			_, err := gate.Acquire(ctx, "m")
			waiting <- err
		}()
		synctest.Wait()
		_, err = gate.Acquire(context.Background(), "m")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, slots.ErrQueueFull)
		assert.Equal(t, pacing.CapProvider, le.Cap)
		cancel()
		require.ErrorIs(t, <-waiting, context.Canceled)
	})
}

// A wait that ends during a pause the upstream asked for names the pause.
func TestRefusalInAPauseNamesIt(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		gate, err := pacing.NewGate("p", pacing.Config{MaxConcurrentRequests: 5, MaxQueueWaitMS: 100})
		require.NoError(t, err)
		defer gate.Close()
		gt, err := gate.Acquire(context.Background(), "m")
		require.NoError(t, err)
		gate.Report(gt, pacing.Verdict{Kind: pacing.Rate, RetryAfter: 5 * time.Second})
		gt.Slot.Release()
		_, err = gate.Acquire(context.Background(), "m")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, pacing.CapPause, le.Cap)
		assert.Equal(t, "the upstream asked for a pause in new requests: 0 in flight, 0 queued (timed out waiting)", slots.ErrorMessage(err))
	})
}
