package pacing_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
)

// A probe that the upstream answered with something other than an
// admission proves nothing of the cap: a rate limit's or a quota's 429, a
// failure, or an overload laid to a more specific cap (a model's). It is
// withdrawn, not taken for admitted once unanswered for a Gap. (Rate and
// Quota probes were taken for admitted: the cap climbed on 429s alone.)
func TestLearnedProbeAnsweredByNoAdmission(t *testing.T) {
	for _, tc := range []struct {
		name  string
		v     pacing.Verdict
		model bool // the model learns too: the provider's cap is not the specific one
	}{
		{"rate", pacing.Verdict{Kind: pacing.Rate, RetryAfter: time.Second}, false},
		{"quota", pacing.Verdict{Kind: pacing.Quota}, false},
		{"other", pacing.Verdict{Kind: pacing.Other}, false},
		{"overload of the model", pacing.Verdict{Kind: pacing.Overload, RetryAfter: time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				cfg := pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 60_000}}
				if tc.model {
					cfg.Models = map[string]pacing.ModelConfig{"m": {Adaptive: &pacing.AdaptiveConfig{Initial: 50}}}
				}
				g := newGate(t, cfg)
				held := acquireN(t, g, 5)
				require.Equal(t, 5, held[4].InFlight, "a probe over the cap of 4")
				g.Report(held[4], tc.v)
				for _, h := range held {
					h.Slot.Release()
				}
				time.Sleep(3 * time.Second) // past any Gap
				assert.Equal(t, 4, g.Learned().Cap)
			})
		})
	}
}

// Under an upstream that answers every request with a rate limit's 429,
// the learned cap does not move: nothing was admitted.
func TestLearnedCapUnderRateLimitsOnly(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, Max: 64, RetestMS: 60_000}})
		for range 20 {
			held := acquireN(t, g, g.Learned().Limit)
			for _, h := range held {
				g.Report(h, pacing.Verdict{Kind: pacing.Rate, RetryAfter: time.Second})
				h.Slot.Release()
			}
			time.Sleep(3 * time.Second)
		}
		assert.Equal(t, 4, g.Learned().Cap)
	})
}

// After a cut, the start that tests it and fails (a 502, a reset: Other)
// proves nothing: the next start tests the cut again, at the floor. (It was
// taken for admitted after a Gap, which ended the cut's one-at-a-time
// starts.)
func TestLearnedCutTestThatFailed(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 8, RetestMS: 60_000}})
		held := acquireN(t, g, 8)
		for _, h := range held {
			g.Report(h, admitted)
			h.Slot.Release()
		}
		held = acquireN(t, g, 8)
		g.Report(held[7], refused) // within the cap: a cut
		for _, h := range held {
			h.Slot.Release()
		}
		test := acquireN(t, g, 1)[0]
		require.Equal(t, g.Learned().Floor, g.Learned().Limit, "the cut's test is out")
		g.Report(test, pacing.Verdict{Kind: pacing.Other})
		test.Slot.Release()
		time.Sleep(3 * time.Second)
		next := acquireN(t, g, 1)[0]
		defer next.Slot.Release()
		assert.Equal(t, g.Learned().Floor, g.Learned().Limit, "the next start tests the cut again")
	})
}

// Learning turned on by Reconfigure while requests are out: their answers
// are of a cap the learner never set, stale evidence. A 429 of one started
// with 30 in flight raised a cap that starts at 4 to 29.
func TestLearningTurnedOnWithRequestsOut(t *testing.T) {
	for _, what := range []string{"provider", "model"} {
		t.Run(what, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				g := newGate(t, pacing.Config{MaxConcurrentRequests: 30})
				held := acquireN(t, g, 30)
				cfg := pacing.Config{MaxConcurrentRequests: 30, Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 60_000}}
				if what == "model" {
					cfg = pacing.Config{MaxConcurrentRequests: 30, Models: map[string]pacing.ModelConfig{"m": {Adaptive: &pacing.AdaptiveConfig{Initial: 4, RetestMS: 60_000}}}}
				}
				require.NoError(t, g.Reconfigure(cfg))
				g.Report(held[29], refused)
				g.Report(held[28], admitted)
				for _, h := range held {
					h.Slot.Release()
				}
				l := g.Learned()
				if what == "model" {
					l = l.Models["m"]
				}
				assert.Equal(t, 4, l.Cap)
			})
		})
	}
}
