package pacing_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
)

// A self-hosted server whose cache holds 1,000,000 tokens, behind a Gate
// with the same max_inflight_tokens: 8 prompts of 500,000 tokens among
// 1,000 small ones (1,000 to 3,000 tokens), all sent at once in a random
// order, large ones held 30 s, small ones 2 s, in virtual time. Counted
// apart from the Gate: the tokens in flight never pass the cache, every
// request is served, and the cost of strict order is bounded: the cache
// idles while small requests wait only when a large one at the head
// waits for the requests before it to end, so at most its tokens for the
// longest hold of those (here 2 s) per large request.
func TestTokensScoreLargePrompts(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		load := testrig.LargePrompts{Cache: 1_000_000, Large: 8, LargeUnits: 500_000, Small: 1000,
			LargeHold: 30 * time.Second, SmallHold: 2 * time.Second}
		g := newGate(t, pacing.Config{MaxInflightTokens: load.Cache, MaxQueue: 2000, MaxQueueWaitMS: pacing.MaxMS})
		s := load.Run(func(_, n int) (func(), error) {
			gt, err := g.AcquireN(context.Background(), "m", n)
			if err != nil {
				return nil, err
			}
			return func() { gt.Slot.Release() }, nil
		})
		assert.Equal(t, load.Large+load.Small, s.Served, "every request served")
		assert.LessOrEqual(t, s.Peak, load.Cache, "never more than the cache in flight")
		bound := load.IdleBound(0)
		t.Logf("8 × 500,000 + 1,000 small: peak %d of %d tokens; the small ones done after %v, using %.1f%% of the token-seconds the large ones left free; "+
			"the cache idled %.2gM token-seconds while small ones waited (bound %.2gM)",
			s.Peak, load.Cache, s.SmallDone, 100*s.SmallShare, s.Idle/1e6, bound/1e6)
		assert.LessOrEqual(t, s.Idle, bound)
	})
}
