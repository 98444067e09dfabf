package pacing_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// outcomes counts a Gate's events by kind.
type outcomes struct{ acquired, rejected, bypassed, released atomic.Int64 }

func (c *outcomes) Observe(e slots.Event) {
	switch e.Kind {
	case slots.EventAcquired:
		c.acquired.Add(1)
	case slots.EventRejected:
		c.rejected.Add(1)
	case slots.EventBypassed:
		c.bypassed.Add(1)
	case slots.EventReleased:
		c.released.Add(1)
	}
}

// TestHammerGateOutcomes: callers weighing tokens, with contexts ended
// before, during and after their waits, against caps reconfigured at
// random, each end in exactly one event; every admission is released; and
// once all are done nothing is held, queued, or counted as queued for the
// token caps (the tokens their Retry-After counts ahead).
func TestHammerGateOutcomes(t *testing.T) {
	for _, onTimeout := range []string{pacing.Reject, pacing.Proceed} {
		t.Run(onTimeout, func(t *testing.T) {
			config := func() pacing.Config {
				return pacing.Config{
					MaxConcurrentRequests: 1 + rand.IntN(3), MaxInflightTokens: rand.IntN(8),
					MaxQueue: 6, MaxQueueWaitMS: 1, OnWaitTimeout: onTimeout,
					Models: map[string]pacing.ModelConfig{"m": {MaxInflightTokens: rand.IntN(6)}},
				}
			}
			ev := &outcomes{}
			g, err := pacing.NewGate("p", config(), slots.WithObserver(ev))
			require.NoError(t, err)
			defer g.Close()
			var calls atomic.Int64
			stop := make(chan struct{})
			var reconfigure sync.WaitGroup
			reconfigure.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					assert.NoError(t, g.Reconfigure(config()))
					runtime.Gosched()
				}
			})
			var wg sync.WaitGroup
			for range 24 {
				wg.Go(func() {
					for range 400 {
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(1500))*time.Microsecond)
						switch rand.IntN(4) {
						case 0:
							cancel() // ended on arrival
						case 1:
							go func() {
								for range rand.IntN(20) {
									runtime.Gosched()
								}
								cancel() // racing the grant
							}()
						}
						if rand.IntN(2) == 0 {
							ctx = slots.WithPriority(ctx, slots.PriorityBatch)
						}
						gt, err := g.AcquireN(ctx, []string{"m", "u1", "u2"}[rand.IntN(3)], 1+rand.IntN(4))
						calls.Add(1)
						switch {
						case err == nil:
							gt.Slot.Release()
						case !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) &&
							!errors.Is(err, slots.ErrQueueFull) && !errors.Is(err, slots.ErrWaitTimeout) &&
							!errors.Is(err, slots.ErrExceedsLimit):
							t.Errorf("unexpected %v", err)
						}
						cancel()
					}
				})
			}
			wg.Wait()
			close(stop)
			reconfigure.Wait()
			t.Logf("%d calls: %d acquired, %d rejected, %d bypassed, %d released", calls.Load(),
				ev.acquired.Load(), ev.rejected.Load(), ev.bypassed.Load(), ev.released.Load())
			assert.Equal(t, calls.Load(), ev.acquired.Load()+ev.rejected.Load()+ev.bypassed.Load(), "one event a call")
			assert.Equal(t, ev.acquired.Load(), ev.released.Load())
			st := g.Status()
			assert.Zero(t, st.InFlight)
			assert.Zero(t, st.Queued)
			provider, models := pacing.QueuedTokens(g)
			assert.Zero(t, provider, "tokens counted as queued for the provider's cap")
			assert.Zero(t, models, "for the models' caps")
		})
	}
}
