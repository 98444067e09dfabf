package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// The 500,000-token scenario of pacing's TestTokensScoreLargePrompts
// across a fleet: a server whose cache holds 1,000,000 tokens, three
// processes sharing a key of that many units on a virtual Redis that runs
// the fleet's scripts, 8 prompts of 500,000 tokens among 1,000 small
// ones, sent at once, each to one of the processes in turn. In virtual
// time: the tokens in flight never pass the cache, every request is
// served, the cache idles while small requests wait no longer than under
// one process's Gate allows, with the hand-offs' round trips as slack (a
// second per large request, far more than they take), small requests use
// at least 90% of what the large ones leave free while they wait (they
// pass a large one up to its bound, as on one Gate), and no large one
// starves.
func TestFleetTokensScoreLargePrompts(t *testing.T) {
	if testing.Short() {
		t.Skip("1,008 waiters on a virtual Redis, some 20 s of CPU under -race")
	}
	testrig.Bubble(t, func(t *testing.T) {
		load := testrig.LargePrompts{Cache: 1_000_000, Large: 8, LargeUnits: 500_000, Small: 1000,
			LargeHold: 3 * time.Second, SmallHold: 200 * time.Millisecond}
		rs := fwFleet(t, newVirtualRedis(t, fwLatency), "tokens-score", 3, load.Cache, WithLogger(quiet()))
		s := load.Run(func(i, n int) (func(), error) {
			sl, err := rs[i%len(rs)].AcquireN(context.Background(), "tokens", n)
			if err != nil {
				return nil, err
			}
			return func() { sl.Release() }, nil
		})
		assert.Equal(t, load.Large+load.Small, s.Served, "every request served")
		assert.LessOrEqual(t, s.Peak, load.Cache, "never more than the cache in flight")
		bound := load.IdleBound(100 * time.Millisecond)
		t.Logf("3 processes, 8 × 500,000 + 1,000 small: peak %d of %d tokens; the small ones done after %v, using %.1f%% of the token-seconds the large ones left free; "+
			"the cache idled %.2gM token-seconds while small ones waited (bound %.2gM); the last large one started after %v",
			s.Peak, load.Cache, s.SmallDone, 100*s.SmallShare, s.Idle/1e6, bound/1e6, s.LargeStart)
		assert.LessOrEqual(t, s.Idle, bound)
		assert.GreaterOrEqual(t, s.SmallShare, 0.9, "small requests use what the large ones leave")
		assert.LessOrEqual(t, s.LargeStart, load.LargeStartBound()+time.Duration(load.Large)*100*time.Millisecond,
			"no large request starves (with the hand-offs' slack)")
		for i, r := range rs {
			st := r.Stats()
			assert.Zero(t, st.Degraded, "process %d: admitted by the store, not locally", i)
			assert.Zero(t, st.StoreErrors, "process %d: store errors", i)
		}
	})
}

// Orgs take turns in tokens across a fleet: three processes share a key of
// 100,000 tokens on a virtual Redis that runs the fleet's scripts; an org
// sends 8 prompts of 50,000 tokens and another 200 of 2,000, all at
// once, each to one of the processes in turn, held 1 s each (virtual
// time). While both wait, each is granted about half of the tokens (with
// turns counted in requests, the org of large prompts took 83% of what was
// granted, and the key stood 40% idle).
func TestFleetTokensTurnsByOrg(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		const limit = 100_000
		rs := fwFleet(t, newVirtualRedis(t, fwLatency), "tokens-turns", 3, limit, WithLogger(quiet()))
		load := testrig.TwoOrgs{Large: 8, LargeUnits: 50_000, Small: 200, SmallUnits: 2_000, Hold: time.Second}
		s := load.Run(4*time.Second, func(i int, org string, units int) (func(), error) {
			sl, err := rs[i%len(rs)].AcquireN(slots.WithFlow(context.Background(), org), "tokens", units)
			if err != nil {
				return nil, err
			}
			return func() { sl.Release() }, nil
		})
		assert.Zero(t, s.Failed)
		assert.LessOrEqual(t, s.Peak, limit)
		t.Logf("first 4 s: %d tokens granted (of %d the key could hold), large org %d, small org %d",
			s.Tokens["large"]+s.Tokens["small"], 4*limit, s.Tokens["large"], s.Tokens["small"])
		assert.InDelta(t, 0.5, s.Part("large", false), 0.1, "the large org's part of the tokens")
	})
}
