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

// A Gate capped on tokens in flight alone tells a refused request when the
// tokens it needs are expected to free (its holders' ends, the tokens
// queued before it and told to come back), not a turn of its unlimited
// count of requests: it was told 1 ms.
func TestTokensRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pacing.Config
	}{
		{"provider", pacing.Config{MaxInflightTokens: 1000, MaxQueue: 1, MaxQueueWaitMS: 60_000}},
		{"model", pacing.Config{MaxQueue: 1, MaxQueueWaitMS: 60_000, Models: map[string]pacing.ModelConfig{"m": {MaxInflightTokens: 1000}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, tc.cfg)
				defer g.Close()
				ctx := context.Background()
				testrig.WarmHolds(t, time.Second, func() (*slots.Slot, error) { gr, err := g.AcquireN(ctx, "m", 1); return gr.Slot, err })
				big, err := g.AcquireN(ctx, "m", 800)
				require.NoError(t, err)
				time.Sleep(200 * time.Millisecond)
				queued := acquireNAsync(ctx, g, "m", 300) // 200 free: it waits
				synctest.Wait()

				var told []time.Duration
				for range 3 {
					_, err = g.AcquireN(ctx, "m", 250) // the queue of one is full
					var le *slots.LimitError
					require.ErrorAs(t, err, &le)
					require.ErrorIs(t, err, slots.ErrQueueFull)
					told = append(told, le.RetryAfter)
				}
				t.Logf("told: %v", told)
				assert.Equal(t, 800*time.Millisecond, told[0], "350 tokens short (50 of its own, 300 queued): when the holder of 800 ends")
				assert.Equal(t, 800*time.Millisecond, told[1], "600 short, with the 250 told before it")
				assert.Equal(t, 1800*time.Millisecond, told[2], "850 short: a mean hold later")

				big.Slot.Release()
				synctest.Wait()
				q := <-queued
				require.NoError(t, q.err)
				q.g.Slot.Release()
			})
		})
	}
}

// Requests refused by a full queue that waits for tokens, while request
// slots are free, are told to come back when the tokens free, not a turn
// of the free slots: the holder of all 100 ends in a second, and frees
// room for the three queued and seven of those refused.
func TestQueueFullBehindTokenWaitersRetryAfter(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 10, MaxInflightTokens: 100, MaxQueue: 3, MaxQueueWaitMS: 60_000})
		defer g.Close()
		ctx := context.Background()
		testrig.WarmHolds(t, time.Second, func() (*slots.Slot, error) { gr, err := g.Acquire(ctx, "m"); return gr.Slot, err })
		big, err := g.AcquireN(ctx, "m", 100)
		require.NoError(t, err)
		var waiting []chan result
		for range 3 {
			waiting = append(waiting, acquireNAsync(ctx, g, "m", 10))
		}
		synctest.Wait()
		require.Equal(t, 3, g.Status().Queued)
		var told []time.Duration
		for range 8 {
			_, err = g.AcquireN(ctx, "m", 10)
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			require.ErrorIs(t, err, slots.ErrQueueFull)
			told = append(told, le.RetryAfter)
		}
		t.Logf("told: %v", told)
		s := time.Second
		assert.Equal(t, []time.Duration{s, s, s, s, s, s, s, 2 * s}, told)
		big.Slot.Release()
		for _, w := range waiting {
			r := <-w
			require.NoError(t, r.err)
			r.g.Slot.Release()
		}
	})
}

// Past 64 holders a token cap reads a sample of their ends: a hundred
// requests of a token each that started together, under a cap of 100, end
// together, so a request of 10 tokens is told when they do (it was told a
// tenth of a mean hold, as if they ended evenly from now).
func TestTokensRetryAfterManyHolders(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 100, MaxQueueWaitMS: 1})
		defer g.Close()
		ctx := context.Background()
		testrig.WarmHolds(t, time.Second, func() (*slots.Slot, error) { gr, err := g.AcquireN(ctx, "m", 1); return gr.Slot, err })
		for range 100 {
			gr, err := g.AcquireN(ctx, "m", 1)
			require.NoError(t, err)
			defer gr.Slot.Release()
		}
		time.Sleep(500 * time.Millisecond)
		_, err := g.AcquireN(ctx, "m", 10)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		t.Logf("%v", err)
		assert.InDelta(t, float64(500*time.Millisecond), float64(le.RetryAfter), float64(2*time.Millisecond), "when the hundred end, less the millisecond it waited")
	})
}
