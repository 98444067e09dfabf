package fleettest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet"
)

// A self-hosted server whose cache holds 1,000,000 tokens behind three
// processes sharing one key of that many units: 8 prompts of 500,000
// tokens among 1,000 small ones (1,000 to 3,000 tokens), sent at once,
// each to one of the processes in turn, large ones held 300 ms and small
// ones 20 ms. Counted apart from the fleet: the tokens in flight never
// pass the cache and every request is served, by the store. (How well
// small requests use the room the large ones leave is scored in virtual
// time; on a real clock it is logged.) The store's calls may take their
// time on a busy machine (a call that times out would count as the
// store's failure, and the local caps would admit meanwhile): 10 s, with
// a lease TTL that allows it.
func largeAmongSmall(t *testing.T, srv Server) {
	load := testrig.LargePrompts{Cache: 1_000_000, Large: 8, LargeUnits: 500_000, Small: 1000,
		LargeHold: 300 * time.Millisecond, SmallHold: 20 * time.Millisecond}
	rs := processes(t, srv, "large", 3, load.Cache, fleet.WithLeaseTTL(30*time.Second), fleet.WithTimeout(2*slowCalls))
	s := load.Run(func(i, n int) (func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 6*wait)
		defer cancel()
		sl, err := rs[i%len(rs)].AcquireN(ctx, "tokens", n)
		if err != nil {
			return nil, err
		}
		return func() { sl.Release() }, nil
	})
	assert.Equal(t, load.Large+load.Small, s.Served, "every request served")
	assert.LessOrEqual(t, s.Peak, load.Cache, "tokens in flight at once")
	t.Logf("8 × 500,000 + 1,000 small over 3 processes: peak %d of %d tokens; the small ones done after %v, "+
		"using %.1f%% of the token-seconds the large ones left free; the cache idled %.2gM token-seconds while small ones waited",
		s.Peak, load.Cache, s.SmallDone.Round(time.Millisecond), 100*s.SmallShare, s.Idle/1e6)
	for _, r := range rs {
		st := r.Stats()
		assert.Zero(t, st.Degraded, "admitted by the store, not locally")
		assert.Zero(t, st.StoreErrors, "store errors")
	}
	inFlightIs(t, rs[0], "tokens", 0, "every unit released")
}
