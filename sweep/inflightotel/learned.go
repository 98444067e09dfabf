package inflightotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/inflight-go/inflight/pacing"
)

// Learner is what LearnedCaps reads: a *pacing.Gate, or a program's own
// view that joins a Gate's answers to caps learned elsewhere (a fleet's).
type Learner interface {
	Learned() pacing.Learned
}

// AttrProvider and AttrAnswer are the attributes of LearnedCaps'
// measurements: the provider, and the kind of an upstream's answer.
const (
	AttrProvider = attribute.Key("inflight.provider")
	AttrAnswer   = attribute.Key("inflight.answer")
)

// LearnedCaps exports the caps a pacing.Gate learns from its upstream's
// answers and the answers reported to it, read from Learner.Learned at
// each collection. Every measurement carries inflight.provider; those of
// a cap inflight.cap as well ("provider" for the provider's own,
// "model:<name>", "api_key:<id>"), one per cap that the Gate's config
// makes learn:
//
//	inflight.learned.limit    gauge   {request} the limit admissions run under now (the floor while a cut is tested)
//	inflight.learned.cap      gauge   {request} the learned cap
//	inflight.learned.ceiling  gauge   {request} the cap is at most this, as last seen
//	inflight.learned.floor    gauge   {request} the lowest the cap may go, as configured
//	inflight.learned.max      gauge   {request} the highest the cap may go, as configured
//	inflight.learned.changes  counter {change}  changes of the cap or its ceiling
//	inflight.upstream.answers counter {answer}  answers reported, one per grant, by inflight.answer:
//	                                            admitted, concurrency, rate, overload, quota, other
//
// It does not take the Gate's OnLimitChange hook, which stays the
// program's. Create it with NewLearnedCaps.
type LearnedCaps struct {
	registration metric.Registration
}

// NewLearnedCaps starts exporting l's learned caps as those of provider
// (a nil l: none). It fails if the meter refuses an instrument.
func NewLearnedCaps(provider string, l Learner, opts ...Option) (*LearnedCaps, error) {
	m := configure(opts).meters.Meter(scope)
	gauges := map[string]string{
		"limit":   "The limit a learned cap lets admissions run under now: the cap, more while probes may go, the floor while a cut is tested.",
		"cap":     "The learned cap: starts up to it go without a test.",
		"ceiling": "The learned cap is at most this, as last seen; inflight.learned.max while unknown.",
		"floor":   "The lowest the learned cap may go, as configured.",
		"max":     "The highest the learned cap may go, as configured.",
	}
	g := map[string]metric.Int64ObservableGauge{}
	var all []metric.Observable
	for name, help := range gauges {
		i, err := m.Int64ObservableGauge("inflight.learned."+name, metric.WithUnit("{request}"), metric.WithDescription(help))
		if err != nil {
			return nil, err
		}
		g[name] = i
		all = append(all, i)
	}
	changes, err := m.Int64ObservableCounter("inflight.learned.changes", metric.WithUnit("{change}"),
		metric.WithDescription("Changes of the learned cap or its ceiling, its first setting included."))
	if err != nil {
		return nil, err
	}
	answers, err := m.Int64ObservableCounter("inflight.upstream.answers", metric.WithUnit("{answer}"),
		metric.WithDescription("The upstream's answers reported to the provider's gate, one per grant, by kind."))
	if err != nil {
		return nil, err
	}
	all = append(all, changes, answers)
	pv := AttrProvider.String(utf8Only(provider))
	observeCap := func(o metric.Observer, capName string, st pacing.Learned) {
		set := metric.WithAttributeSet(attribute.NewSet(pv, AttrCap.String(utf8Only(capName))))
		for name, v := range map[string]int{"limit": st.Limit, "cap": st.Cap, "ceiling": st.Ceiling, "floor": st.Floor, "max": st.Max} {
			o.ObserveInt64(g[name], int64(v), set)
		}
		o.ObserveInt64(changes, int64(st.Changes), set)
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if l == nil {
			return nil // the SDK's collecting goroutine is no place to panic
		}
		st := l.Learned()
		for k, n := range st.ByKind {
			o.ObserveInt64(answers, int64(n), metric.WithAttributes(pv, AttrAnswer.String(pacing.Kind(k).String())))
		}
		if st.Floor > 0 { // the provider's own cap is learned
			observeCap(o, "provider", st)
		}
		for name, ml := range st.Models {
			observeCap(o, "model:"+name, ml)
		}
		for id, kl := range st.Keys {
			observeCap(o, "api_key:"+id, kl)
		}
		return nil
	}, all...)
	if err != nil {
		return nil, err
	}
	return &LearnedCaps{registration: reg}, nil
}

// Close stops the export.
func (c *LearnedCaps) Close() error { return c.registration.Unregister() }
