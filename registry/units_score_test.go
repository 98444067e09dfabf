package registry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// pacing's TestTokensScoreLargePrompts on a Limiter and on a Registry key
// of 1,000,000 units (virtual time): 8 prompts of 500,000 tokens among
// 1,000 small ones, sent at once. The units in flight never pass the cap,
// small requests use at least 90% of what the large ones leave free while
// they wait, and the last large one starts within LargeStartBound (the
// bound on passing is tested by the test below).
func TestUnitsScoreLargePrompts(t *testing.T) {
	for _, owner := range []string{"limiter", "registry"} {
		t.Run(owner, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				load := testrig.LargePrompts{Cache: 1_000_000, Large: 8, LargeUnits: 500_000, Small: 1000,
					LargeHold: 30 * time.Second, SmallHold: 2 * time.Second}
				acquire := ownerOf(owner, load.Cache)
				s := load.Run(func(_, n int) (func(), error) { return acquire(n) })
				assert.Equal(t, load.Large+load.Small, s.Served, "every request served")
				assert.LessOrEqual(t, s.Peak, load.Cache)
				t.Logf("small ones done after %v, using %.1f%% of the units the large ones left free while they waited; the last large one started after %v",
					s.SmallDone, 100*s.SmallShare, s.LargeStart)
				assert.GreaterOrEqual(t, s.SmallShare, 0.9)
				assert.LessOrEqual(t, s.LargeStart, load.LargeStartBound())
			})
		})
	}
}

// A heavy caller among callers of one unit that keep the cap full starves
// nobody (virtual time): 10 clients, each taking a unit for 1 s and
// coming back at once, staggered by 100 ms, under a cap of 10; a caller
// of 5 units comes at 550 ms. Each release frees one unit, which a light
// caller takes past it until they have taken its bound (core.PassFactor
// times 5 units, 2 s of releases); then the units freed are kept for it,
// and within one more hold it is in. Passing without a bound would keep
// it out for as long as the light callers come.
func TestUnitsHeavyCallerAmongLightOnesStartsWithinItsBound(t *testing.T) {
	for _, owner := range []string{"limiter", "registry"} {
		t.Run(owner, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				const hold = time.Second
				waited := testrig.HeavyAmongLight(t, hold, ownerOf(owner, 10))
				bound := time.Duration(5*core.PassFactor)*hold/10 + hold
				t.Logf("the caller of 5 units waited %v (bound %v)", waited, bound)
				assert.LessOrEqual(t, waited, bound)
				assert.Less(t, waited, 10*time.Second, "passing without a bound kept it out 29.85 s, until the light callers stopped")
			})
		})
	}
}

// ownerOf returns what acquires n units of a new Limiter of limit units,
// or of key "p" of a new Registry (owner "registry"), and what frees them.
func ownerOf(owner string, limit int) func(n int) (func(), error) {
	l := slots.NewLimiter(limit)
	reg := registry.New[string](limit)
	return func(n int) (func(), error) {
		var s *slots.Slot
		var err error
		if owner == "limiter" {
			s, err = l.AcquireN(context.Background(), n)
		} else {
			s, err = reg.AcquireN(context.Background(), "p", n)
		}
		if err != nil {
			return nil, err
		}
		return func() { s.Release() }, nil
	}
}
