package inflightprom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// newGate returns a Gate on a clock that stands still, so that no probe is
// taken as admitted while the test runs, and closes it at the end.
func newGate(t *testing.T, cfg pacing.Config) *pacing.Gate {
	t.Helper()
	g, err := pacing.NewGate("zai", cfg, slots.WithClock(clock.NewMock()))
	require.NoError(t, err)
	t.Cleanup(g.Close)
	return g
}

// acquire takes n grants for model; each should start at once, and one
// that waits fails the test instead of hanging it.
func acquire(t *testing.T, g *pacing.Gate, model string, n int) []pacing.Grant {
	t.Helper()
	var out []pacing.Grant
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		gt, err := g.Acquire(ctx, model)
		cancel()
		require.NoError(t, err)
		out = append(out, gt)
	}
	return out
}

func TestLearnedCapsMetrics(t *testing.T) {
	retest := int64(time.Minute / time.Millisecond)
	g := newGate(t, pacing.Config{
		MaxConcurrentRequests: 10,
		Adaptive:              &pacing.AdaptiveConfig{Initial: 4, RetestMS: retest},
		Models:                map[string]pacing.ModelConfig{"glm-5": {Adaptive: &pacing.AdaptiveConfig{Initial: 2, RetestMS: retest}}},
	})
	c := inflightprom.NewLearnedCaps("zai", g)

	glm := acquire(t, g, "glm-5", 3) // the model's third is its probe
	g.Report(glm[2], pacing.Verdict{Kind: pacing.Concurrency})
	other := acquire(t, g, "glm-4", 2) // the provider's fifth is its probe
	require.Equal(t, 5, other[1].InFlight)
	g.Report(other[1], pacing.Verdict{Kind: pacing.Concurrency})
	g.Report(glm[0], pacing.Verdict{Kind: pacing.Admitted})
	g.Report(glm[0], pacing.Verdict{Kind: pacing.Admitted}) // again: not counted
	g.Report(other[0], pacing.Verdict{Kind: pacing.Rate, RetryAfter: time.Second})

	const want = `
# HELP inflight_learned_cap The learned cap: starts up to it go without a test.
# TYPE inflight_learned_cap gauge
inflight_learned_cap{cap="model:glm-5",provider="zai"} 2
inflight_learned_cap{cap="provider",provider="zai"} 4
# HELP inflight_learned_ceiling The learned cap is at most this, as last seen; inflight_learned_max while unknown.
# TYPE inflight_learned_ceiling gauge
inflight_learned_ceiling{cap="model:glm-5",provider="zai"} 2
inflight_learned_ceiling{cap="provider",provider="zai"} 4
# HELP inflight_learned_changes_total Changes of the learned cap or its ceiling, its first setting included.
# TYPE inflight_learned_changes_total counter
inflight_learned_changes_total{cap="model:glm-5",provider="zai"} 2
inflight_learned_changes_total{cap="provider",provider="zai"} 2
# HELP inflight_learned_floor The lowest the learned cap may go, as configured.
# TYPE inflight_learned_floor gauge
inflight_learned_floor{cap="model:glm-5",provider="zai"} 1
inflight_learned_floor{cap="provider",provider="zai"} 1
# HELP inflight_learned_limit The limit a learned cap lets admissions run under now: the cap, more while probes may go, the floor while a cut is tested.
# TYPE inflight_learned_limit gauge
inflight_learned_limit{cap="model:glm-5",provider="zai"} 2
inflight_learned_limit{cap="provider",provider="zai"} 4
# HELP inflight_learned_max The highest the learned cap may go, as configured.
# TYPE inflight_learned_max gauge
inflight_learned_max{cap="model:glm-5",provider="zai"} 1024
inflight_learned_max{cap="provider",provider="zai"} 10
# HELP inflight_upstream_answers_total The upstream's answers reported to the provider's gate, one per grant, by kind.
# TYPE inflight_upstream_answers_total counter
inflight_upstream_answers_total{kind="admitted",provider="zai"} 1
inflight_upstream_answers_total{kind="concurrency",provider="zai"} 2
inflight_upstream_answers_total{kind="other",provider="zai"} 0
inflight_upstream_answers_total{kind="overload",provider="zai"} 0
inflight_upstream_answers_total{kind="quota",provider="zai"} 0
inflight_upstream_answers_total{kind="rate",provider="zai"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want)))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestLearnedCapsOfAKeyPool(t *testing.T) {
	g := newGate(t, pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 2},
		APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 3}, {ID: "k2"}}})
	c := inflightprom.NewLearnedCaps("zai", g)
	const want = `
# HELP inflight_learned_max The highest the learned cap may go, as configured.
# TYPE inflight_learned_max gauge
inflight_learned_max{cap="api_key:k1",provider="zai"} 3
inflight_learned_max{cap="api_key:k2",provider="zai"} 1024
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "inflight_learned_max"))
	assert.Equal(t, 2, testutil.CollectAndCount(c, "inflight_learned_cap"), "each key learns, not the provider")
}

func TestLearnedCapsWithoutLearning(t *testing.T) {
	g := newGate(t, pacing.Config{MaxConcurrentRequests: 4})
	c := inflightprom.NewLearnedCaps("zai", g)
	g.Report(acquire(t, g, "m", 1)[0], pacing.Verdict{Kind: pacing.Overload})
	const want = `
# HELP inflight_upstream_answers_total The upstream's answers reported to the provider's gate, one per grant, by kind.
# TYPE inflight_upstream_answers_total counter
inflight_upstream_answers_total{kind="admitted",provider="zai"} 0
inflight_upstream_answers_total{kind="concurrency",provider="zai"} 0
inflight_upstream_answers_total{kind="other",provider="zai"} 0
inflight_upstream_answers_total{kind="overload",provider="zai"} 1
inflight_upstream_answers_total{kind="quota",provider="zai"} 0
inflight_upstream_answers_total{kind="rate",provider="zai"} 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want)), "one series per kind, counted without learning too")
}
