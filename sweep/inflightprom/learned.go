package inflightprom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inflight-go/inflight/pacing"
)

// LearnedCaps is a prometheus.Collector of a pacing.Gate's learned caps and
// of the upstream's answers reported to it, read from Gate.Learned at each
// scrape. It does not take the Gate's OnLimitChange hook, which stays free
// for the program's own use. Create it with NewLearnedCaps; the zero value
// is not usable.
type LearnedCaps struct {
	gate Learner

	limit, learned, ceiling, floor, max *prometheus.Desc
	changes, answers                    *prometheus.Desc
}

var _ prometheus.Collector = (*LearnedCaps)(nil)

// Learner is what LearnedCaps reads: a *pacing.Gate, or a program's own
// view that joins a Gate's answers to caps learned elsewhere (a fleet's).
type Learner interface {
	Learned() pacing.Learned
}

// NewLearnedCaps returns a Collector of gate's learned caps, whose series
// carry the label provider=provider. Each learned cap is told apart by the
// label cap, named as the caps of a gateway are: "provider" for the
// provider's own, "model:<name>" for a model's, "api_key:<id>" for a key's
// when a key pool learns. Models and keys are those of the Gate's config
// that learn, so the series are as many as the config makes them. A nil
// gate exports nothing.
func NewLearnedCaps(provider string, gate Learner) *LearnedCaps {
	labels := prometheus.Labels{"provider": provider}
	desc := func(m, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("inflight", "", m), help, variable, labels)
	}
	return &LearnedCaps{
		gate:    gate,
		limit:   desc("learned_limit", "The limit a learned cap lets admissions run under now: the cap, more while probes may go, the floor while a cut is tested.", "cap"),
		learned: desc("learned_cap", "The learned cap: starts up to it go without a test.", "cap"),
		ceiling: desc("learned_ceiling", "The learned cap is at most this, as last seen; inflight_learned_max while unknown.", "cap"),
		floor:   desc("learned_floor", "The lowest the learned cap may go, as configured.", "cap"),
		max:     desc("learned_max", "The highest the learned cap may go, as configured.", "cap"),
		changes: desc("learned_changes_total", "Changes of the learned cap or its ceiling, its first setting included.", "cap"),
		answers: desc("upstream_answers_total", "The upstream's answers reported to the provider's gate, one per grant, by kind.", "kind"),
	}
}

// Describe implements prometheus.Collector.
func (c *LearnedCaps) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.limit, c.learned, c.ceiling, c.floor, c.max, c.changes, c.answers} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A Gate that learns no cap has
// only the answers' series.
func (c *LearnedCaps) Collect(ch chan<- prometheus.Metric) {
	if c.gate == nil {
		return // a scrape's goroutine is no place to panic
	}
	st := c.gate.Learned()
	for k, n := range st.ByKind {
		ch <- constMetric(c.answers, prometheus.CounterValue, float64(n), pacing.Kind(k).String())
	}
	if st.Floor > 0 { // the provider's own cap is learned
		c.collectCap(ch, "provider", st)
	}
	for name, m := range st.Models {
		c.collectCap(ch, "model:"+name, m)
	}
	for id, k := range st.Keys {
		c.collectCap(ch, "api_key:"+id, k)
	}
}

func (c *LearnedCaps) collectCap(ch chan<- prometheus.Metric, capName string, l pacing.Learned) {
	gauge := func(d *prometheus.Desc, v int) {
		ch <- constMetric(d, prometheus.GaugeValue, float64(v), capName)
	}
	gauge(c.limit, l.Limit)
	gauge(c.learned, l.Cap)
	gauge(c.ceiling, l.Ceiling)
	gauge(c.floor, l.Floor)
	gauge(c.max, l.Max)
	ch <- constMetric(c.changes, prometheus.CounterValue, float64(l.Changes), capName)
}
