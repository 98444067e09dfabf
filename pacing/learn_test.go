package pacing_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
)

var (
	admitted = pacing.Verdict{Kind: pacing.Admitted}
	refused  = pacing.Verdict{Kind: pacing.Concurrency, RetryAfter: time.Second}
)

// acquireN takes n grants at once, failing the test if one waits.
func acquireN(t *testing.T, g *pacing.Gate, n int) []pacing.Grant {
	t.Helper()
	var out []pacing.Grant
	for range n {
		c := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		require.Len(t, c, 1, "admitted at once")
		r := <-c
		require.NoError(t, r.err)
		out = append(out, r.g)
	}
	return out
}

func TestLearnedCapClimbs(t *testing.T) {
	t.Run("a probe the upstream admits raises the limit", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 2}})
			assert.Equal(t, 3, g.Learned().Limit, "one start over the floor may test it")
			held := acquireN(t, g, 3)
			assert.Equal(t, 3, held[2].InFlight)
			fourth := acquireAsync(context.Background(), g, "m")
			synctest.Wait()
			assert.Len(t, fourth, 0, "one probe at a time")
			g.Report(held[2], admitted)
			synctest.Wait()
			require.Len(t, fourth, 1, "the admitted probe let the next one go")
			l := g.Learned()
			assert.Equal(t, 3, l.Cap)
			assert.Equal(t, 5, l.Limit, "no ceiling is known: the next batch is two wide")
		})
	})
	t.Run("a probe not refused within the gap is taken as admitted", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 2}})
			acquireN(t, g, 3)
			time.Sleep(time.Second)
			assert.Equal(t, 3, g.Learned().Cap)
		})
	})
	t.Run("demand that does not fill the limit raises nothing", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 2}})
			for range 50 {
				gt := acquireN(t, g, 2)
				g.Report(gt[0], admitted)
				g.Report(gt[1], admitted)
				gt[0].Slot.Release()
				gt[1].Slot.Release()
				time.Sleep(time.Second)
			}
			assert.Equal(t, 2, g.Learned().Cap)
		})
	})
	t.Run("a configured max_concurrent_requests stays the ceiling", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxConcurrentRequests: 3, Adaptive: &pacing.AdaptiveConfig{Initial: 10}})
			assert.Equal(t, 3, g.Learned().Limit)
			held := acquireN(t, g, 3)
			g.Report(held[2], admitted)
			time.Sleep(time.Minute)
			l := g.Learned()
			assert.Equal(t, 3, l.Limit)
			assert.Equal(t, 3, l.Ceiling)
		})
	})
}

func TestLearnedCapFalls(t *testing.T) {
	t.Run("a refused probe sets the ceiling, and the next test waits retest_ms", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 5000}})
			held := acquireN(t, g, 5)
			g.Report(held[4], refused)
			l := g.Learned()
			assert.Equal(t, 4, l.Cap)
			assert.Equal(t, 4, l.Ceiling)
			assert.Equal(t, 4, l.Limit)
			held[4].Slot.Release()
			time.Sleep(4900 * time.Millisecond)
			assert.Equal(t, 4, g.Learned().Limit)
			time.Sleep(200 * time.Millisecond)
			assert.Equal(t, 5, g.Learned().Limit, "one start may test the ceiling again")
		})
	})
	// refuseAt starts one request with n in flight (releasing holders down
	// to n-1 first) and reports it refused.
	refuseAt := func(t *testing.T, g *pacing.Gate, held *[]pacing.Grant, n int) {
		t.Helper()
		for len(*held) >= n {
			(*held)[len(*held)-1].Slot.Release()
			*held = (*held)[:len(*held)-1]
		}
		next := acquireN(t, g, 1)[0]
		require.Equal(t, n, next.InFlight)
		g.Report(next, refused)
		next.Slot.Release()
	}
	t.Run("refusals at a proven count step down twice, then halve the cap; more refusals step down", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 12, RetestMS: 60_000}})
			held := acquireN(t, g, 12)
			for _, h := range held {
				g.Report(h, admitted)
			}
			refuseAt(t, g, &held, 12)
			l := g.Learned()
			assert.Equal(t, 11, l.Cap, "one step: a single refusal may be noise")
			assert.Equal(t, 11, l.Ceiling)
			refuseAt(t, g, &held, 11)
			assert.Equal(t, 9, g.Learned().Cap, "refused again before any admission: two steps")
			refuseAt(t, g, &held, 9)
			assert.Equal(t, 4, g.Learned().Cap, "a third time: the cap fell, halved")
			refuseAt(t, g, &held, 4)
			assert.Equal(t, 2, g.Learned().Cap, "then steps of 2, 4, 8, ...")
			refuseAt(t, g, &held, 2)
			assert.Equal(t, 1, g.Learned().Cap, "down to the floor")
		})
	})
	t.Run("a refusal that an admission follows was noise: the cap stays one down", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 8, RetestMS: 60_000}})
			held := acquireN(t, g, 8)
			for _, h := range held {
				g.Report(h, admitted)
			}
			refuseAt(t, g, &held, 8)
			require.Equal(t, 7, g.Learned().Cap)
			held[len(held)-1].Slot.Release()
			held = held[:len(held)-1]
			test := acquireN(t, g, 1)[0] // the test of the cut
			require.Equal(t, 7, test.InFlight)
			g.Report(test, admitted)
			held = append(held, test)
			refuseAt(t, g, &held, 7)
			assert.Equal(t, 6, g.Learned().Cap, "a new streak: one step again, not a halving")
		})
	})
	t.Run("evidence from before a cut is stale", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 6, RetestMS: 60_000}})
			held := acquireN(t, g, 6)
			g.Report(held[5], refused) // not proven: the floor falls to 5
			assert.Equal(t, 5, g.Learned().Cap)
			g.Report(held[4], admitted)
			g.Report(held[3], refused)
			assert.Equal(t, 5, g.Learned().Cap, "both started before the cut")
		})
	})
	t.Run("the floor holds", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Min: 2, Initial: 2}})
			held := acquireN(t, g, 2)
			g.Report(held[1], refused)
			assert.Equal(t, 2, g.Learned().Cap)
		})
	})
}

func TestReportPausesAndQuota(t *testing.T) {
	t.Run("Retry-After of a rate refusal pauses new starts and leaves the cap", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4}})
			gt := acquireN(t, g, 1)[0]
			g.Report(gt, pacing.Verdict{Kind: pacing.Rate, RetryAfter: 2 * time.Second})
			assert.Equal(t, 4, g.Learned().Cap)
			start := time.Now()
			c := acquireAsync(context.Background(), g, "m")
			synctest.Wait()
			assert.Len(t, c, 0, "paused")
			r := <-c
			require.NoError(t, r.err)
			assert.Equal(t, 2*time.Second, time.Since(start))
		})
	})
	t.Run("without learning too", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxConcurrentRequests: 4})
			gt := acquireN(t, g, 3)
			g.Report(gt[0], pacing.Verdict{Kind: pacing.Overload})
			assert.Equal(t, time.Second, g.Learned().PausedFor)
			assert.False(t, g.Learned().Enabled)
			g.Report(gt[1], refused) // counted, and nothing to learn
			g.Report(gt[2], admitted)
			l := g.Learned()
			assert.Equal(t, uint64(1), l.ByKind[pacing.Overload])
			assert.Equal(t, uint64(1), l.ByKind[pacing.Concurrency])
			assert.Equal(t, uint64(1), l.ByKind[pacing.Admitted])
			assert.Zero(t, l.Floor, "no cap learned: no bounds")
		})
	})
	t.Run("a key out of quota leaves the pool until its reset", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 1}, {ID: "k2", MaxConcurrentRequests: 1}}})
			gt := acquireN(t, g, 1)[0]
			require.Equal(t, "k1", gt.Key)
			g.Report(gt, pacing.Verdict{Kind: pacing.Quota, RetryAfter: 30 * time.Second})
			gt.Slot.Release()
			second := acquireN(t, g, 1)[0]
			assert.Equal(t, "k2", second.Key)
			third := acquireAsync(context.Background(), g, "m")
			synctest.Wait()
			assert.Len(t, third, 0, "k1 is out, k2 is full")
			start := time.Now()
			r := <-third
			require.NoError(t, r.err)
			assert.Equal(t, "k1", r.g.Key)
			assert.Equal(t, 30*time.Second, time.Since(start))
		})
	})
}

// TestReportTakesEachGrantOnce: Report is for once per grant; a grant
// reported again, with the same verdict or another, is neither counted nor
// evidence.
func TestReportTakesEachGrantOnce(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 60_000}})
		held := acquireN(t, g, 2)
		g.Report(held[0], admitted)
		g.Report(held[0], admitted)
		again := held[0] // a copy of the Grant is the same grant
		g.Report(again, refused)
		g.Report(held[0], pacing.Verdict{Kind: pacing.Rate, RetryAfter: 5 * time.Second})
		held[1].Slot.Release()
		g.Report(held[1], admitted) // late, after its release: counted, once
		g.Report(held[1], admitted)

		l := g.Learned()
		assert.Equal(t, [6]uint64{pacing.Admitted: 2}, l.ByKind, "one answer per grant")
		assert.Equal(t, pacing.DefaultAdaptiveMax, l.Ceiling, "the second verdict is no refusal")
		assert.Equal(t, 4, l.Cap)
		assert.Zero(t, l.PausedFor, "nor a pause")
		g.Close()
	})
}

func TestAdaptiveConfig(t *testing.T) {
	c, err := pacing.Parse([]byte(`{"adaptive": {"min": 1, "max": 64, "initial": 4}}`))
	require.NoError(t, err)
	assert.Equal(t, &pacing.AdaptiveConfig{Min: 1, Max: 64, Initial: 4}, c.Adaptive)
	_, err = pacing.Parse([]byte(`{"max_concurrent_requests": 5, "adaptive": {"min": 8}}`))
	assert.EqualError(t, err, "pacing: adaptive.min: 8 is over the ceiling 5")
	_, err = pacing.Parse([]byte(`{"adaptive": {"initial": -1}}`))
	assert.EqualError(t, err, "pacing: adaptive.initial: -1 is negative")

	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 7, Adaptive: &pacing.AdaptiveConfig{Initial: 2}})
		require.NoError(t, g.Reconfigure(pacing.Config{MaxConcurrentRequests: 7}))
		assert.False(t, g.Learned().Enabled)
		held := acquireN(t, g, 7)
		assert.Equal(t, 7, held[6].InFlight, "without learning the configured cap applies")
	})
}

// TestLearnedBounds: Learned says within which bounds each cap moves, as
// configured and defaulted.
func TestLearnedBounds(t *testing.T) {
	for _, c := range []struct {
		name       string
		cfg        pacing.Config
		floor, max int
	}{
		{"defaults", pacing.Config{Adaptive: &pacing.AdaptiveConfig{}}, pacing.DefaultAdaptiveMin, pacing.DefaultAdaptiveMax},
		{"max_concurrent_requests is the ceiling", pacing.Config{MaxConcurrentRequests: 7, Adaptive: &pacing.AdaptiveConfig{Min: 2}}, 2, 7},
		{"or a lower max", pacing.Config{MaxConcurrentRequests: 100, Adaptive: &pacing.AdaptiveConfig{Max: 64}}, 1, 64},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newGate(t, c.cfg).Learned()
			assert.Equal(t, c.floor, l.Floor)
			assert.Equal(t, c.max, l.Max)
		})
	}
}

// Many callers acquire, report random answers and release while the
// learned limit moves: never more in flight than the ceiling, every call
// returns, and nothing is left held.
func TestLearnedCapHammer(t *testing.T) {
	const ceiling = 12
	g := newGate(t, pacing.Config{MaxConcurrentRequests: ceiling, MaxQueue: 1000,
		Adaptive: &pacing.AdaptiveConfig{Initial: 3, RetestMS: 1}})
	var inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	kinds := []pacing.Kind{pacing.Admitted, pacing.Admitted, pacing.Admitted, pacing.Concurrency, pacing.Other}
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 300 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(3))*time.Millisecond)
				gt, err := g.Acquire(ctx, "m")
				cancel()
				if err != nil {
					continue
				}
				n := inFlight.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				g.Report(gt, pacing.Verdict{Kind: kinds[rng.IntN(len(kinds))]})
				inFlight.Add(-1)
				gt.Slot.Release()
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, peak.Load(), int64(ceiling))
	assert.Zero(t, g.Status().InFlight)
	l := g.Learned()
	assert.GreaterOrEqual(t, l.Cap, 1)
	assert.LessOrEqual(t, l.Cap, ceiling)
	assert.LessOrEqual(t, l.Limit, ceiling)
	g.Close()
}

func TestOnLimitChange(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4}})
		var got []pacing.LimitChange
		g.OnLimitChange(func(c pacing.LimitChange) {
			got = append(got, c)
			_ = g.Learned() // called outside the Gate's lock
		})
		held := acquireN(t, g, 5)
		g.Report(held[4], refused)
		g.Report(held[0], admitted) // changes nothing: no event
		require.Len(t, got, 1)
		assert.Equal(t, pacing.LimitChange{Seq: 2, Provider: "zai", OldCap: 4, Cap: 4, OldCeiling: pacing.DefaultAdaptiveMax, Ceiling: 4,
			Evidence: pacing.Evidence{Kind: pacing.Concurrency, InFlight: 5}}, got[0], "the first change was the initial cap")

		require.NoError(t, g.Reconfigure(pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, Max: 3}}))
		require.Len(t, got, 2, "a lower max is a change too")
		assert.Equal(t, 3, got[1].Cap)
		assert.Equal(t, uint64(3), got[1].Seq)
		g.OnLimitChange(nil)
	})
}

func TestOverloadBacksOffGently(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 20}})
		gt := acquireN(t, g, 1)[0]
		g.Report(gt, pacing.Verdict{Kind: pacing.Overload, RetryAfter: 30 * time.Second})
		l := g.Learned()
		assert.Equal(t, 18, l.Cap, "a tenth off")
		assert.Equal(t, pacing.DefaultAdaptiveMax, l.Ceiling, "the ceiling is left")
		assert.Equal(t, 10*time.Second, l.PausedFor, "a long Retry-After pauses at most 10 s")
		assert.Equal(t, uint64(1), l.ByKind[pacing.Overload])
	})
}

func TestEachKeyLearnsItsCap(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 2, RetestMS: 60_000},
			APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 10}, {ID: "k2"}}})
		var got []pacing.LimitChange
		g.OnLimitChange(func(c pacing.LimitChange) { got = append(got, c) })
		l := g.Learned()
		assert.Zero(t, l.Cap, "the keys learn, not the provider")
		assert.Equal(t, map[string]pacing.Learned{
			"k1": {Enabled: true, Limit: 3, Cap: 2, Ceiling: 10, Floor: 1, Max: 10, Changes: 1},
			"k2": {Enabled: true, Limit: 3, Cap: 2, Ceiling: pacing.DefaultAdaptiveMax, Floor: 1, Max: pacing.DefaultAdaptiveMax, Changes: 1},
		}, l.Keys)
		held := acquireN(t, g, 6)
		byKey := map[string][]pacing.Grant{}
		for _, h := range held {
			byKey[h.Key] = append(byKey[h.Key], h)
		}
		require.Len(t, byKey["k1"], 3)
		require.Len(t, byKey["k2"], 3)
		g.Report(byKey["k1"][2], refused)
		g.Report(byKey["k2"][2], admitted)
		l = g.Learned()
		assert.Equal(t, 2, l.Keys["k1"].Cap)
		assert.Equal(t, 2, l.Keys["k1"].Ceiling, "k1 refused its third")
		assert.Equal(t, 3, l.Keys["k2"].Cap, "k2 admitted its third")
		require.Len(t, got, 2)
		assert.Equal(t, pacing.LimitChange{Seq: 3, Provider: "zai", Key: "k1", OldCap: 2, Cap: 2, OldCeiling: 10, Ceiling: 2,
			Evidence: pacing.Evidence{Kind: pacing.Concurrency, InFlight: 3}}, got[0])
		assert.Equal(t, "k2", got[1].Key)

		next := acquireN(t, g, 1)[0]
		assert.Equal(t, "k2", next.Key, "k1 is at its learned cap")

		require.NoError(t, g.Reconfigure(pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 10}, {ID: "k2", MaxConcurrentRequests: 4}}}))
		assert.False(t, g.Learned().Enabled)
		next = acquireN(t, g, 1)[0]
		assert.Equal(t, "k1", next.Key, "without learning k1 has its configured cap again")
	})
}

func TestAModelLearnsItsCap(t *testing.T) {
	_, err := pacing.Parse([]byte(`{"models": {"glm-5": {"max_concurrent_requests": 2, "adaptive": {"min": 5}}}}`))
	assert.EqualError(t, err, `pacing: models["glm-5"].adaptive.min: 5 is over the ceiling 2`)

	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 10,
			Models: map[string]pacing.ModelConfig{"glm-5": {Adaptive: &pacing.AdaptiveConfig{Initial: 2, RetestMS: 60_000}}}})
		var got []pacing.LimitChange
		g.OnLimitChange(func(c pacing.LimitChange) { got = append(got, c) })
		var held []pacing.Grant
		for range 3 {
			c := acquireAsync(context.Background(), g, "glm-5")
			synctest.Wait()
			require.Len(t, c, 1)
			r := <-c
			require.NoError(t, r.err)
			held = append(held, r.g)
		}
		blocked := acquireAsync(context.Background(), g, "glm-5")
		synctest.Wait()
		assert.Len(t, blocked, 0, "a fourth waits for the third's answer")
		g.Report(held[2], refused)
		l := g.Learned()
		assert.Zero(t, l.Cap, "the provider's cap is configured")
		assert.Equal(t, pacing.Learned{Enabled: true, Limit: 2, Cap: 2, Ceiling: 2, Floor: 1, Max: pacing.DefaultAdaptiveMax, Changes: 2}, l.Models["glm-5"])
		require.Len(t, got, 1)
		assert.Equal(t, "glm-5", got[0].Model)
		for range 7 {
			c := acquireAsync(context.Background(), g, "glm-4")
			synctest.Wait()
			require.Len(t, c, 1, "another model is not held back")
		}
		require.NoError(t, g.Reconfigure(pacing.Config{MaxConcurrentRequests: 10}))
		assert.Nil(t, g.Learned().Models)
		held[2].Slot.Release()
		synctest.Wait()
		require.Len(t, blocked, 1, "without learning glm-5 has no cap of its own")
		g.Close()
	})
}

func TestRetryAfterPausesOnlyItsKey(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 2}, {ID: "k2", MaxConcurrentRequests: 1}}})
		gt := acquireN(t, g, 1)[0]
		require.Equal(t, "k1", gt.Key)
		g.Report(gt, pacing.Verdict{Kind: pacing.Rate, RetryAfter: 3 * time.Second})
		assert.Zero(t, g.Learned().PausedFor, "the provider is not paused")
		other := acquireN(t, g, 1)[0]
		assert.Equal(t, "k2", other.Key, "k1 is paused, k2 is not")
		start := time.Now()
		r := <-acquireAsync(context.Background(), g, "m")
		require.NoError(t, r.err)
		assert.Equal(t, "k1", r.g.Key)
		assert.Equal(t, 3*time.Second, time.Since(start))
	})
}

func TestAnAdmissionProvesEveryLaneOnItsPath(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 2, RetestMS: 60_000},
			Models: map[string]pacing.ModelConfig{"glm-5": {Adaptive: &pacing.AdaptiveConfig{Initial: 2, RetestMS: 60_000}}}})
		held := acquireN(t, g, 3) // model "m": the provider's probe is the third
		g.Report(held[2], admitted)
		assert.Equal(t, 3, g.Learned().Cap)
		for _, h := range held {
			h.Slot.Release()
		}

		var glm []pacing.Grant
		for range 3 {
			c := acquireAsync(context.Background(), g, "glm-5")
			synctest.Wait()
			require.Len(t, c, 1)
			glm = append(glm, (<-c).g)
		}
		g.Report(glm[2], admitted)
		l := g.Learned()
		assert.Equal(t, 3, l.Models["glm-5"].Cap, "the model's cap is proven")
		assert.Equal(t, 3, l.Cap, "and the provider's holds")

		c := acquireAsync(context.Background(), g, "glm-5")
		synctest.Wait()
		require.Len(t, c, 1)
		fourth := (<-c).g
		require.Equal(t, 4, fourth.InFlight, "a probe of both caps")
		g.Report(fourth, refused)
		l = g.Learned()
		assert.Equal(t, 3, l.Models["glm-5"].Ceiling, "the refusal is the model's")
		assert.Equal(t, pacing.DefaultAdaptiveMax, l.Ceiling, "and tells the provider nothing")
		time.Sleep(time.Second)
		assert.Equal(t, 3, g.Learned().Cap, "the provider's withdrawn probe is not taken as admitted")
		g.Close()
	})
}
