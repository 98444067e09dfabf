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
)

// Reconfigure changes the spacing of starts at once: the next start comes
// the new interval after the last one, for the provider's spacing and a
// model's, raised, lowered or taken out. (The next start stayed where the
// old interval had put it: a minute after the last once 1 a minute was
// raised to 600, and 100 ms once 600 was lowered to 1.)
func TestReconfigureRespacesTheNextStart(t *testing.T) {
	provider := func(rpm int) pacing.Config { return pacing.Config{RequestsPerMinute: rpm, MaxQueueWaitMS: 120_000} }
	model := func(rpm int) pacing.Config {
		return pacing.Config{MaxQueueWaitMS: 120_000, Models: map[string]pacing.ModelConfig{"m": {RequestsPerMinute: rpm}}}
	}
	for _, tc := range []struct {
		name     string
		from, to pacing.Config
		next     time.Duration // after the last start
	}{
		{"provider raised", provider(1), provider(600), 100 * time.Millisecond},
		{"provider lowered", provider(600), provider(1), time.Minute},
		{"provider taken out", provider(1), provider(0), 0},
		{"model raised", model(1), model(600), 100 * time.Millisecond},
		{"model lowered", model(600), model(1), time.Minute},
		{"model taken out", model(1), model(0), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, tc.from)
				first, err := g.Acquire(context.Background(), "m")
				require.NoError(t, err)
				first.Slot.Release()
				last := time.Now()
				waiter := acquireAsync(context.Background(), g, "m")
				synctest.Wait()
				require.NoError(t, g.Reconfigure(tc.to))
				r := <-waiter
				require.NoError(t, r.err)
				r.g.Slot.Release()
				assert.Equal(t, tc.next, time.Since(last), "the next start, after the last")
			})
		})
	}
}
