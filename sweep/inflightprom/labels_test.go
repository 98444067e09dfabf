package inflightprom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// learnedView is a program's own Learner, as WithLearner and
// NewLearnedCaps take one, that reports what it is given.
type learnedView struct{ l pacing.Learned }

func (v learnedView) Learned() pacing.Learned { return v.l }

// gatherWithoutPanic collects c directly (where a panic can be caught) and
// then through a registry, and returns the registry's error: a label value
// Prometheus refuses must fail the scrape of that series, not end the
// process, since Collect runs on the registry's own goroutines where no
// caller can recover it.
func gatherWithoutPanic(t *testing.T, c prometheus.Collector) error {
	_, err := gatherSeries(t, c)
	return err
}

// gatherSeries is gatherWithoutPanic that also returns how many series
// the registry gathered, the refused ones left out.
func gatherSeries(t *testing.T, c prometheus.Collector) (int, error) {
	t.Helper()
	require.NotPanics(t, func() {
		ch := make(chan prometheus.Metric, 256)
		c.Collect(ch)
		close(ch)
		for range ch {
		}
	}, "Collect panicked on a label value Prometheus refuses")
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	families, err := reg.Gather()
	n := 0
	for _, f := range families {
		n += len(f.GetMetric())
	}
	return n, err
}

// A learned cap whose model name is not UTF-8 (a program's own Learner, or
// a Config built in code: Validate lets such a name through) fails that
// series of the scrape with an error and leaves the others.
func TestLearnedCapsRefuseANonUTF8ModelWithoutPanicking(t *testing.T) {
	l := pacing.Learned{Models: map[string]pacing.Learned{
		"\xff": {Limit: 2, Cap: 2, Ceiling: 4, Floor: 1, Max: 4},
		"ok":   {Limit: 3, Cap: 3, Ceiling: 4, Floor: 1, Max: 4},
	}}
	n, err := gatherSeries(t, inflightprom.NewLearnedCaps("zai", learnedView{l}))
	assert.ErrorContains(t, err, "UTF-8")
	assert.Equal(t, 6+6, n, "model:ok's six series, and the six answer kinds' counts, still gathered")
}

// A budget whose cap names a key that is not UTF-8 fails that series of
// the scrape with an error rather than ending the process.
func TestBudgetsRefuseANonUTF8CapWithoutPanicking(t *testing.T) {
	c := inflightprom.NewBudgets(func() []inflightprom.Budget {
		return []inflightprom.Budget{
			{Cap: "tenant:\xff", Budget: pacing.CapTokensPerMinute, Left: 1, Limit: 2},
			{Cap: "tenant", Budget: pacing.CapMaxRequestsPerMinute, Left: 1, Limit: 2},
		}
	})
	assert.ErrorContains(t, gatherWithoutPanic(t, c), "UTF-8")
}

// A source's refusal reason that is not UTF-8 fails that series of the
// scrape with an error rather than ending the process.
func TestCollectorRefusesANonUTF8ReasonWithoutPanicking(t *testing.T) {
	c := inflightprom.New("tenant")
	inflightprom.Watch(c, func() inflightprom.Snapshot {
		return inflightprom.Snapshot{InFlight: 1, Waiting: 0, Keys: -1, Limit: 2,
			Counts: &inflightprom.Counts{Rejected: map[string]uint64{"\xff": 1, "limit_reached": 2}}}
	})
	assert.ErrorContains(t, gatherWithoutPanic(t, c), "UTF-8")
}

// Watch with a nil function stops watching: a scrape then reports no
// source's series, as before the first Watch, rather than calling nil.
func TestWatchNilStopsWatchingWithoutPanicking(t *testing.T) {
	c := inflightprom.New("tenant")
	inflightprom.Watch(c, func() inflightprom.Snapshot {
		return inflightprom.Snapshot{InFlight: 1, Waiting: 0, Keys: -1, Limit: 2}
	})
	inflightprom.Watch(c, nil)
	require.NoError(t, gatherWithoutPanic(t, c))
}
