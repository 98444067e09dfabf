package pacing_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
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

// Orgs take turns in tokens, not requests: behind a Gate of 100,000
// tokens in flight, an org sending 40 prompts of 50,000 tokens and one
// sending 2,000 of 1,000, all at once and held 1 s each, are granted
// about half of the tokens each while both wait (virtual time). Counted
// in requests, the org of large prompts would take 98% of them.
func TestTokensTurnsByOrg(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 100_000, MaxQueue: 3000, MaxQueueWaitMS: pacing.MaxMS})
		start := time.Now()
		var mu sync.Mutex
		var peak, inFlight int
		granted := map[string]int{} // tokens granted in the first 10 s
		var wg sync.WaitGroup
		send := func(org string, tokens int) {
			wg.Go(func() {
				gt, err := g.AcquireN(slots.WithFlow(context.Background(), org), "m", tokens)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				inFlight += tokens
				peak = max(peak, inFlight)
				if time.Since(start) < 10*time.Second {
					granted[org] += tokens
				}
				mu.Unlock()
				time.Sleep(time.Second) // the request's turn upstream
				mu.Lock()
				inFlight -= tokens
				mu.Unlock()
				gt.Slot.Release()
			})
		}
		for i := range 2000 {
			if i%50 == 0 {
				send("large", 50_000)
			}
			send("small", 1_000)
		}
		wg.Wait()
		assert.LessOrEqual(t, peak, 100_000)
		total := granted["large"] + granted["small"]
		t.Logf("first 10 s: %d tokens granted, large %d, small %d", total, granted["large"], granted["small"])
		assert.InDelta(t, 0.5, float64(granted["large"])/float64(total), 0.1, "large org's part of the tokens")
	})
}
