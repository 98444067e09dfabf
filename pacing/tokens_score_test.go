package pacing_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
		const cache = 1_000_000
		g := newGate(t, pacing.Config{MaxInflightTokens: cache, MaxQueue: 2000, MaxQueueWaitMS: pacing.MaxMS})
		type req struct {
			n    int
			hold time.Duration
		}
		rng := rand.New(rand.NewPCG(7, 8))
		var reqs []req
		for range 1000 {
			reqs = append(reqs, req{1000 + rng.IntN(2001), 2 * time.Second})
		}
		for range 8 {
			reqs = append(reqs, req{500_000, 30 * time.Second})
		}
		rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })

		type event struct {
			at    time.Time
			delta int
			large bool
		}
		var mu sync.Mutex
		var events []event
		waitingSmall := 1000  // all sent at once
		var waits []time.Time // when the count of small ones waiting changed, and to what
		var waitCounts []int
		inFlight, peak := 0, 0
		begin := time.Now()
		var wg sync.WaitGroup
		for _, r := range reqs {
			large := r.n >= 500_000
			wg.Go(func() {
				gt, err := g.AcquireN(context.Background(), "m", r.n)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				if !large {
					waitingSmall--
					waits, waitCounts = append(waits, time.Now()), append(waitCounts, waitingSmall)
				}
				inFlight += r.n
				peak = max(peak, inFlight)
				events = append(events, event{time.Now(), r.n, large})
				mu.Unlock()
				time.Sleep(r.hold) // the server's work
				mu.Lock()
				inFlight -= r.n
				events = append(events, event{time.Now(), -r.n, large})
				mu.Unlock()
				gt.Slot.Release()
			})
		}
		wg.Wait()
		require.Len(t, events, 2*len(reqs), "every request served")
		assert.LessOrEqual(t, peak, cache, "never more than the cache in flight")

		// The token-seconds the large ones left free, and those the small
		// ones used, until the last small one ended; and those the cache
		// idled while small ones waited.
		slices.SortStableFunc(events, func(a, b event) int { return a.at.Compare(b.at) })
		waitingAt := func(t time.Time) int { // small ones waiting just after t
			i, _ := slices.BinarySearchFunc(waits, t, func(a, t time.Time) int { return a.Compare(t.Add(1)) })
			if i == 0 {
				return 1000
			}
			return waitCounts[i-1]
		}
		var idle float64
		var end time.Time
		for _, e := range events {
			if !e.large && e.delta < 0 {
				end = e.at
			}
		}
		var free, used float64
		large, small := 0, 0
		at := begin
		for _, e := range events {
			if e.at.After(end) {
				break
			}
			d := e.at.Sub(at).Seconds()
			free += float64(cache-large) * d
			used += float64(small) * d
			if waitingAt(at) > 0 {
				idle += float64(cache-large-small) * d
			}
			at = e.at
			if e.large {
				large += e.delta
			} else {
				small += e.delta
			}
		}
		bound := 8 * 500_000 * 2.0
		t.Logf("8 × 500,000 + 1,000 small: peak %d of %d tokens; the small ones done after %v, using %.1f%% of the token-seconds the large ones left free; "+
			"the cache idled %.2gM token-seconds while small ones waited (bound %.2gM)",
			peak, cache, end.Sub(begin), 100*used/free, idle/1e6, bound/1e6)
		assert.LessOrEqual(t, idle, bound)
	})
}
