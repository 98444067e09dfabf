package pacing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// TestGateRetryAfterSpreadsReturns is slots' TestRetryAfterSpreadsReturns on
// a provider's cap: 12 clients, each sending 4 requests of a 1 s turn (give
// or take 10%) one after another, through a Gate of 2 requests in flight
// with a queue of 4 and a 500 ms wait; a refused request is sent again
// after its Retry-After, at most 5 times; ten runs, in virtual time.
func TestGateRetryAfterSpreadsReturns(t *testing.T) {
	var runs []testrig.Saturated
	for seed := range uint64(10) {
		turn := testrig.Turns(seed)
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxConcurrentRequests: 2, MaxQueue: 4, MaxQueueWaitMS: 500})
			defer g.Close()
			runs = append(runs, testrig.Saturate(12, 4, func(int) (bool, time.Duration) {
				gr, err := g.Acquire(context.Background(), "m")
				var le *slots.LimitError
				if errors.As(err, &le) {
					return false, le.RetryAfter
				}
				if !assert.NoError(t, err) {
					return false, time.Second
				}
				time.Sleep(turn())
				gr.Slot.Release()
				return true, 0
			}, func() bool { return g.Status().InFlight < 2 }))
		})
	}
	testrig.ScoreReturns(t, 48, runs)
}
