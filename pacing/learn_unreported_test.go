package pacing_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
)

// Under an upstream that never refuses, a Gate kept full climbs to its
// max whether its callers report their grants or not: a grant never
// reported is taken as admitted a Gap after its start. (Unreported, the cap
// stayed at its first probe's count for as long as the load lasted: every
// start over the cap moved the batch's time on, and with starts coming
// faster than a Gap, the batch was never taken as admitted.)
func TestLearnedCapClimbsUnderSteadyLoad(t *testing.T) {
	for _, report := range []bool{true, false} {
		name := "unreported"
		if report {
			name = "reported"
		}
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, Max: 16, RetestMS: 60_000}})
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				for i := range 40 { // more callers than the max: the Gate stays full
					hold := 600*time.Millisecond + time.Duration(i%7)*50*time.Millisecond
					wg.Go(func() {
						for {
							gr, err := g.Acquire(ctx, "m")
							if err != nil {
								assert.True(t, errors.Is(err, context.Canceled), "%v", err)
								return
							}
							time.Sleep(hold)
							if report {
								g.Report(gr, admitted)
							}
							gr.Slot.Release()
						}
					})
				}
				time.Sleep(30 * time.Second)
				l := g.Learned()
				cancel()
				wg.Wait()
				require.Equal(t, 16, l.Max)
				assert.Equal(t, 16, l.Cap, "no refusal in 30 s of load: the cap climbs to the max")
			})
		})
	}
}
