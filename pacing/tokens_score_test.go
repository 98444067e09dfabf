package pacing_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// A self-hosted server whose cache holds 1,000,000 tokens, behind a Gate
// with the same max_inflight_tokens: 8 prompts of 500,000 tokens among
// 1,000 small ones (1,000 to 3,000 tokens), all sent at once in a random
// order, large ones held 30 s, small ones 2 s, in virtual time. Counted
// apart from the Gate: the tokens in flight never pass the cache, every
// request is served, small requests use at least 90% of the tokens the
// large ones leave free while they wait (they pass a large one that does
// not fit, up to its bound), and the last large one starts within
// LargeStartBound (this load is finite, so passing without a bound would
// meet that too: TestTokensHeavyRequestAmongLightOnesStartsWithinItsBound
// is what tests the bound). Measured: the small ones done after 10 s,
// using 100% of what was free; under strict order, 2m8s and 47–57%. The
// last large one started after 1m40s either way.
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
			"the cache idled %.2gM token-seconds while small ones waited (bound %.2gM); the last large one started after %v",
			s.Peak, load.Cache, s.SmallDone, 100*s.SmallShare, s.Idle/1e6, bound/1e6, s.LargeStart)
		assert.LessOrEqual(t, s.Idle, bound)
		assert.GreaterOrEqual(t, s.SmallShare, 0.9, "small requests use what the large ones leave")
		assert.LessOrEqual(t, s.LargeStart, load.LargeStartBound(), "no large request starves")
	})
}

// Orgs take turns by the cap that binds (virtual time): an org sending
// prompts of 50,000 tokens and one sending prompts of 1,000, all at once
// and held 1 s each. Behind a Gate of 100,000 tokens in flight, each is
// granted about half of the tokens while both wait (with turns counted in
// requests, the org of large prompts took 89% of them); behind one of 10
// requests in flight whose token cap is far off, each is granted about
// half of the requests (with turns counted in tokens, the org of small
// prompts took 98 of 100).
func TestTokensTurnsByOrg(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    pacing.Config
		large  int  // the large org's requests
		tokens bool // the tokens bind, not the requests
	}{
		{"tokens bind", pacing.Config{MaxInflightTokens: 100_000}, 40, true},
		{"requests bind", pacing.Config{MaxConcurrentRequests: 10, MaxInflightTokens: 10_000_000}, 200, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				tc.cfg.MaxQueue, tc.cfg.MaxQueueWaitMS = 3000, pacing.MaxMS
				g := newGate(t, tc.cfg)
				load := testrig.TwoOrgs{Large: tc.large, LargeUnits: 50_000, Small: 2000, SmallUnits: 1_000, Hold: time.Second}
				s := load.Run(10*time.Second, func(_ int, org string, units int) (func(), error) {
					gt, err := g.AcquireN(slots.WithFlow(context.Background(), org), "m", units)
					if err != nil {
						return nil, err
					}
					return func() { gt.Slot.Release() }, nil
				})
				assert.Zero(t, s.Failed)
				assert.LessOrEqual(t, s.Peak, tc.cfg.MaxInflightTokens)
				t.Logf("first 10 s: large org %d requests, %d tokens; small org %d requests, %d tokens",
					s.Requests["large"], s.Tokens["large"], s.Requests["small"], s.Tokens["small"])
				assert.InDelta(t, 0.5, s.Part("large", !tc.tokens), 0.1, "the large org's part of what binds")
			})
		})
	}
}

// Requests that all take one slot of the provider's cap alternate between
// orgs as they did before turns counted costs, with a token cap beside
// the request cap or without one: A1 B1 A2 B2 ... (each request starts
// once the one before it has ended; 3 slots, 2 of them held throughout).
func TestTurnsOfOneSlotAlternate(t *testing.T) {
	for name, cfg := range map[string]pacing.Config{
		"requests":            {MaxConcurrentRequests: 3},
		"requests and tokens": {MaxConcurrentRequests: 3, MaxInflightTokens: 1_000_000},
	} {
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				cfg.MaxQueue, cfg.MaxQueueWaitMS = 100, pacing.MaxMS
				g := newGate(t, cfg)
				var held []pacing.Grant
				for range 3 {
					gt, err := g.Acquire(context.Background(), "m")
					require.NoError(t, err)
					held = append(held, gt)
				}
				var want []string
				got := map[string]chan result{}
				for i := 1; i <= 8; i++ {
					for _, org := range []string{"A", "B"} {
						name := fmt.Sprint(org, i)
						want = append(want, name)
						got[name] = acquireAsync(slots.WithFlow(context.Background(), org), g, "m")
						synctest.Wait()
					}
				}
				held[0].Slot.Release()
				var order []string
				for range want {
					synctest.Wait()
					for name, c := range got {
						select {
						case r := <-c:
							require.NoError(t, r.err)
							order = append(order, name)
							r.g.Slot.Release()
						default:
						}
					}
				}
				assert.Equal(t, want, order)
				held[1].Slot.Release()
				held[2].Slot.Release()
			})
		})
	}
}

// A heavy request among light ones that keep the tokens in flight at the
// cap starts within its bound (virtual time), as on a Limiter
// (registry's TestUnitsHeavyCallerAmongLightOnesStartsWithinItsBound): 10
// clients take a token each for 1 s and come back at once, staggered by
// 100 ms, under a cap of 10 tokens; a request of 5 comes at 550 ms.
func TestTokensHeavyRequestAmongLightOnesStartsWithinItsBound(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxInflightTokens: 10, MaxQueue: 100, MaxQueueWaitMS: pacing.MaxMS})
		const hold = time.Second
		waited := testrig.HeavyAmongLight(t, hold, func(n int) (func(), error) {
			gt, err := g.AcquireN(context.Background(), "m", n)
			if err != nil {
				return nil, err
			}
			return func() { gt.Slot.Release() }, nil
		})
		bound := time.Duration(5*core.PassFactor)*hold/10 + hold
		t.Logf("the request of 5 tokens waited %v (bound %v)", waited, bound)
		assert.LessOrEqual(t, waited, bound)
		assert.Less(t, waited, 10*time.Second)
	})
}
