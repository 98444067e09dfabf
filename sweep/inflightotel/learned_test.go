package inflightotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
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

// acquire takes n grants for model; each should start at once.
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

// A Gate's learned caps, each with its provider and cap, and the answers
// reported to it, by kind: the numbers Gate.Learned gives.
func TestLearnedCaps(t *testing.T) {
	m := newMeters(t)
	retest := int64(time.Minute / time.Millisecond)
	g := newGate(t, pacing.Config{
		MaxConcurrentRequests: 10,
		Adaptive:              &pacing.AdaptiveConfig{Initial: 4, RetestMS: retest},
		Models:                map[string]pacing.ModelConfig{"glm-5": {Adaptive: &pacing.AdaptiveConfig{Initial: 2, RetestMS: retest}}},
	})
	lc, err := inflightotel.NewLearnedCaps("zai", g, inflightotel.WithMeterProvider(m))
	require.NoError(t, err)

	glm := acquire(t, g, "glm-5", 3) // the model's third is its probe
	g.Report(glm[2], pacing.Verdict{Kind: pacing.Concurrency})
	other := acquire(t, g, "glm-4", 2) // the provider's fifth is its probe
	require.Equal(t, 5, other[1].InFlight)
	g.Report(other[1], pacing.Verdict{Kind: pacing.Concurrency})
	g.Report(glm[0], pacing.Verdict{Kind: pacing.Admitted})
	g.Report(other[0], pacing.Verdict{Kind: pacing.Rate, RetryAfter: time.Second})

	got := m.collect(t)
	const model, provider = "inflight.cap=model:glm-5,inflight.provider=zai", "inflight.cap=provider,inflight.provider=zai"
	for name, want := range map[string]map[string]int64{
		"inflight.learned.cap":     {model: 2, provider: 4},
		"inflight.learned.ceiling": {model: 2, provider: 4},
		"inflight.learned.limit":   {model: 2, provider: 4},
		"inflight.learned.floor":   {model: 1, provider: 1},
		"inflight.learned.max":     {model: 1024, provider: 10},
		"inflight.learned.changes": {model: 2, provider: 2},
	} {
		assert.Equal(t, want, ints(t, got[name]), name)
	}
	assert.Equal(t, map[string]int64{
		"inflight.answer=admitted,inflight.provider=zai":    1,
		"inflight.answer=concurrency,inflight.provider=zai": 2,
		"inflight.answer=rate,inflight.provider=zai":        1,
		"inflight.answer=overload,inflight.provider=zai":    0,
		"inflight.answer=quota,inflight.provider=zai":       0,
		"inflight.answer=other,inflight.provider=zai":       0,
	}, ints(t, got["inflight.upstream.answers"]))

	require.NoError(t, lc.Close())
	assert.Empty(t, m.collect(t), "nothing read after Close")
}

// A Gate whose API keys learn their caps: each key's measurements carry
// inflight.cap=api_key:<id>, with the numbers Gate.Learned gives.
func TestLearnedCapsOfKeys(t *testing.T) {
	m := newMeters(t)
	g := newGate(t, pacing.Config{
		MaxConcurrentRequests: 10,
		Adaptive:              &pacing.AdaptiveConfig{Initial: 2, RetestMS: int64(time.Minute / time.Millisecond)},
		APIKeys:               []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 4}, {ID: "k2", MaxConcurrentRequests: 6}},
	})
	lc, err := inflightotel.NewLearnedCaps("zai", g, inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	defer lc.Close()
	grants := acquire(t, g, "glm-5", 3)
	g.Report(grants[2], pacing.Verdict{Kind: pacing.Concurrency})

	got := m.collect(t)
	learned := g.Learned().Keys
	require.Len(t, learned, 2)
	for name, of := range map[string]func(pacing.Learned) int{
		"inflight.learned.cap":     func(l pacing.Learned) int { return l.Cap },
		"inflight.learned.ceiling": func(l pacing.Learned) int { return l.Ceiling },
		"inflight.learned.limit":   func(l pacing.Learned) int { return l.Limit },
		"inflight.learned.floor":   func(l pacing.Learned) int { return l.Floor },
		"inflight.learned.max":     func(l pacing.Learned) int { return l.Max },
		"inflight.learned.changes": func(l pacing.Learned) int { return int(l.Changes) },
	} {
		want := map[string]int64{}
		for id, l := range learned {
			want["inflight.cap=api_key:"+id+",inflight.provider=zai"] = int64(of(l))
		}
		assert.Equal(t, want, ints(t, got[name]), name)
	}
	assert.Equal(t, 4, learned["k1"].Max, "each key learns up to its own configured cap")
	assert.Equal(t, 6, learned["k2"].Max)
}

// A nil Learner exports nothing, as a nil Watch does: the collection
// panicked, on the SDK's goroutine in a program, which ends it.
func TestLearnedCapsOfNilExportNothing(t *testing.T) {
	m := newMeters(t)
	lc, err := inflightotel.NewLearnedCaps("zai", nil, inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	defer lc.Close()
	require.NotPanics(t, func() {
		got := m.collect(t)
		assert.NotContains(t, got, "inflight.learned.cap")
		assert.NotContains(t, got, "inflight.upstream.answers")
	})
}
