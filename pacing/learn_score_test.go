package pacing_test

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/pacing/pacingtest"
)

func scoreCfg(a *pacing.AdaptiveConfig) pacing.Config {
	return pacing.Config{MaxQueue: 200, MaxQueueWaitMS: 30_000, Adaptive: a}
}

// score is a learned run against a baseline that knows the hidden cap.
type score struct {
	refused           float64 // share of attempts answered 429
	goodput           float64 // work served, against the baseline's
	start, drop, rise time.Duration
}

func runScore(t *testing.T, sc pacingtest.Scenario, a *pacing.AdaptiveConfig) score {
	var learned, static pacingtest.Result
	testrig.Bubble(t, func(t *testing.T) { learned = pacingtest.Score(sc, scoreCfg(a)) })
	testrig.Bubble(t, func(t *testing.T) {
		static = pacingtest.ScoreFollowing(sc, scoreCfg(nil), func(c int) int { return c - sc.Foreign })
	})
	require := assert.New(t)
	require.Zero(static.Upstream.Refused, "the baseline knows the cap")
	return score{
		refused: learned.RefusedShare(),
		goodput: float64(learned.Upstream.Work) / float64(static.Upstream.Work),
		start:   learned.Settle[0], drop: learned.Settle[1], rise: learned.Settle[2],
	}
}

// worst folds the scores of several seeds: the highest share of 429s, the
// lowest goodput, the longest settling ("never" is longest).
func worst(ss []score) score {
	w := ss[0]
	longer := func(a, b time.Duration) time.Duration {
		if a < 0 || b < 0 {
			return -1
		}
		return max(a, b)
	}
	for _, s := range ss[1:] {
		w.refused = max(w.refused, s.refused)
		w.goodput = min(w.goodput, s.goodput)
		w.start, w.drop, w.rise = longer(w.start, s.start), longer(w.drop, s.drop), longer(w.rise, s.rise)
	}
	return w
}

func (s score) String() string {
	d := func(d time.Duration) string {
		if d < 0 {
			return "never"
		}
		return d.Round(100 * time.Millisecond).String()
	}
	return fmt.Sprintf("%5.2f%% 429s | goodput %5.1f%% | settles from the start %s, after the drop %s, after the rise %s",
		100*s.refused, 100*s.goodput, d(s.start), d(s.drop), d(s.rise))
}

var seeds = []uint64{1, 2, 3, 4, 5}

// seeded returns sc with the seed's arrivals and service times, and its
// changes of cap moved later by up to a minute, by the seed: a retest
// interval that divides the phases' length would otherwise meet each
// change at the same point of its cycle in every run.
func seeded(sc pacingtest.Scenario, seed uint64) pacingtest.Scenario {
	sc.Seed = seed
	sc.Schedule = slices.Clone(sc.Schedule)
	var shift time.Duration
	for i := 1; i < len(sc.Schedule); i++ {
		shift += time.Duration((seed*7919+uint64(i)*104729)%300) * 100 * time.Millisecond / time.Duration(len(sc.Schedule)-1)
		sc.Schedule[i].At += shift
	}
	sc.Duration += shift
	return sc
}

func scenarios() []pacingtest.Scenario {
	return []pacingtest.Scenario{pacingtest.Drop, pacingtest.Shared, pacingtest.Lagged, pacingtest.Varied, pacingtest.Fast}
}

// The learned cap in the scenarios, in virtual time, from no
// configured cap: each figure is the worst of five seeds (arrivals, service
// times, when the cap changes), against a static cap that follows the
// hidden one. The
// bounds are what the learner achieves today, with a margin: a change that
// makes it worse fails here. Run with -v for the figures.
func TestLearnedCapScore(t *testing.T) {
	for _, sc := range scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			var ss []score
			for _, seed := range seeds {
				ss = append(ss, runScore(t, seeded(sc, seed), &pacing.AdaptiveConfig{}))
			}
			w := worst(ss)
			t.Log(w)
			// Runs differ a little from one another: requests that start in
			// the same instant reach the upstream in the order the
			// scheduler runs them.
			assert.LessOrEqual(t, w.refused, 0.03, "429s / attempts")
			assert.GreaterOrEqual(t, w.goodput, 0.94, "goodput against a static cap at the true value")
			// The goal is 15 s after a rise and 5 s after a drop. Over 20
			// to 60 seeds of each scenario the learner settled within 5 s
			// of the start, 14 s of the rise and 5 s of the drop, but for
			// two seeds after the drop (6 s in Fast, 13 s with refusals
			// that vary). The bounds leave room for the order in which the
			// scheduler runs starts of the same instant.
			for what, d := range map[string]time.Duration{"the start": w.start, "the drop": w.drop, "the rise": w.rise} {
				assert.True(t, d >= 0 && d <= 20*time.Second, "settles within 20 s of %s: %v", what, d)
			}
		})
	}
}

var retestSweep = flag.Bool("retest-sweep", false, "print what retest_ms trades in the learned cap's scenarios")

// What retest_ms trades: each retest that finds the cap unchanged costs a
// 429; a longer one finds a rise later. Figures only:
//
//	go test ./pacing -run RetestTradeoff -retest-sweep -v
func TestLearnedCapRetestTradeoff(t *testing.T) {
	if !*retestSweep {
		t.Skip("figures only: run with -retest-sweep")
	}
	var b strings.Builder
	for _, sc := range scenarios() {
		for _, retest := range []int64{5_000, 10_000, 20_000, 30_000, 60_000} {
			var ss []score
			for _, seed := range seeds {
				ss = append(ss, runScore(t, seeded(sc, seed), &pacing.AdaptiveConfig{RetestMS: retest}))
			}
			fmt.Fprintf(&b, "%-20s retest %3ds: %v\n", sc.Name, retest/1000, worst(ss))
		}
	}
	// The other client's 2 requests against a static cap at the account's
	// documented limit.
	var refused []float64
	for _, seed := range seeds {
		sc := seeded(pacingtest.Shared, seed)
		testrig.Bubble(t, func(t *testing.T) {
			r := pacingtest.ScoreFollowing(sc, scoreCfg(nil), func(c int) int { return c })
			refused = append(refused, r.RefusedShare())
		})
	}
	fmt.Fprintf(&b, "%-20s static at the account's cap: %.1f%% 429s (worst seed)\n", pacingtest.Shared.Name, 100*slices.Max(refused))
	t.Log("\n" + b.String())
}
