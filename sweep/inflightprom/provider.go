package inflightprom

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// Provider is a prometheus.Collector of a model provider's caps as a
// pacing.Transport admits its requests, one Collector per cap, told apart
// by the label cap: "provider", "model:<name>" for each model its Config
// names (every other model together under "model:other", so that model
// names read from request bodies cannot multiply the series),
// "api_key:<id>" for each API key and "api_keys" for the pool as a whole.
//
// In flight, waiting and limits are read from the Gate at each scrape,
// learned limits through the Learner (WithLearner). Admissions, releases,
// refusals, and the time waited and held, are counted from the Trace each
// request is sent with (Trace): a request taking a fleet's caps
// (pacing.WithFleet), from its call to the answer, counts as waiting for
// its model's cap and the provider's, and that time as waited. A refusal
// is counted once, under the cap that refused it (the model's for its
// model's caps and budgets, the pool's when every key was full or out of
// budget, else the provider's: its cap, its queue's bounds, its pacing, a
// fleet's refusal, a client that left). An API key is given to a request
// as it starts, so its series have no waiting and no refusals. A Bypassed
// admission (fail-open) counts as bypassed, with no release.
//
// Its caps, and their configured limits, are those of the Config given to
// NewProvider: after Gate.Reconfigure, unregister it and register a new
// one (its counts start again from 0). They are one
// provider's: a program with several registers each Provider in a
// registry of its own. Create it with NewProvider; the zero value is not
// usable.
type Provider struct {
	gate    *pacing.Gate
	learner Learner
	reason  func(error) string

	provider *capCounts
	models   map[string]*capCounts // read-only after NewProvider
	other    *capCounts
	keys     map[string]*capCounts // read-only after NewProvider
	pool     *capCounts            // nil without API keys
	traces   map[string]*pacing.Trace
	trace    *pacing.Trace // the other models'
	all      []*Collector
	byName   map[string]*capCounts // every cap; read-only after NewProvider
}

var _ prometheus.Collector = (*Provider)(nil)

// A ProviderOption configures a Provider; a nil one is ignored.
type ProviderOption interface{ applyProvider(*Provider) }

type providerOption func(*Provider)

func (f providerOption) applyProvider(p *Provider) { f(p) }

// WithLearner makes a Provider read the learned caps of the provider and
// its models from l (a program's view that joins a fleet's learned caps to
// the Gate's) rather than from the Gate; those of API keys are the Gate's.
// A nil l is ignored, as a nil option is: each scrape would call it.
func WithLearner(l Learner) ProviderOption {
	return providerOption(func(p *Provider) {
		if l != nil {
			p.learner = l
		}
	})
}

// WithRejectReason names the reason of a refusal the Provider does not
// know (an error of the program's own, a fleet's store unavailable, say):
// f returns one of RejectReasons, or "" for "other".
func WithRejectReason(f func(error) string) ProviderOption {
	return providerOption(func(p *Provider) { p.reason = f })
}

// RejectReasons are the values of inflight_rejected_total's label reason
// for a Provider's caps.
var RejectReasons = []string{"limit_reached", "queue_full", "wait_timeout", "exceeds_limit", "over_budget", "unavailable", "canceled", "other"}

// NewProvider returns a Provider of gate's caps, as cfg (the Config gate
// was made with) names them.
func NewProvider(gate *pacing.Gate, cfg pacing.Config, opts ...ProviderOption) *Provider {
	p := &Provider{gate: gate, learner: gate, models: map[string]*capCounts{}, keys: map[string]*capCounts{},
		traces: map[string]*pacing.Trace{}, byName: map[string]*capCounts{}}
	for _, o := range opts {
		if o != nil {
			o.applyProvider(p)
		}
	}
	p.provider = p.newCap("provider", true, func(st pacing.Status, c *capCounts) Snapshot {
		limit := limitOf(cfg.MaxConcurrentRequests)
		if l := p.learner.Learned(); l.Floor > 0 { // learned: the limit in force
			limit = l.Limit
		}
		return Snapshot{InFlight: st.InFlight, Waiting: st.Queued + int(c.fleetWaiting.Load()), Keys: -1, Limit: limit}
	})
	for name, mc := range cfg.Models {
		m := p.newCap("model:"+name, true, func(st pacing.Status, c *capCounts) Snapshot {
			limit := limitOf(mc.MaxConcurrentRequests)
			if l, learned := p.learner.Learned().Models[name]; learned {
				limit = l.Limit
			}
			return Snapshot{InFlight: st.ByModel[name], Waiting: st.WaitingByModel[name] + int(c.fleetWaiting.Load()), Keys: -1, Limit: limit}
		})
		p.models[name] = m
		p.traces[name] = p.newTrace(m)
	}
	other := "model:other"
	for {
		if _, named := cfg.Models[other[len("model:"):]]; !named {
			break
		}
		other += " (unnamed)" // a model called "other" keeps "model:other"
	}
	p.other = p.newCap(other, true, func(st pacing.Status, c *capCounts) Snapshot {
		s := Snapshot{Waiting: int(c.fleetWaiting.Load()), Keys: -1, Limit: slots.Unlimited}
		for model, n := range st.ByModel {
			if _, named := p.models[model]; !named {
				s.InFlight += n
			}
		}
		for model, n := range st.WaitingByModel {
			if _, named := p.models[model]; !named {
				s.Waiting += n
			}
		}
		return s
	})
	p.trace = p.newTrace(p.other)
	for _, k := range cfg.APIKeys {
		p.keys[k.ID] = p.newCap("api_key:"+k.ID, false, func(st pacing.Status, c *capCounts) Snapshot {
			limit := limitOf(k.MaxConcurrentRequests)
			if l, learned := gate.Learned().Keys[k.ID]; learned {
				limit = l.Limit
			}
			return Snapshot{InFlight: st.ByKey[k.ID], Waiting: -1, Keys: -1, Limit: limit}
		})
	}
	if len(cfg.APIKeys) > 0 {
		// The pool reads its keys at each scrape: from a copy, since the
		// caller's Config shares its slice, and an edit of it in place (the
		// next Config for Gate.Reconfigure) would change the pool's limit
		// but not its keys', and race with the scrape.
		keys := slices.Clone(cfg.APIKeys)
		p.pool = p.newCap("api_keys", true, func(st pacing.Status, c *capCounts) Snapshot {
			learned := gate.Learned().Keys
			s := Snapshot{Waiting: -1, Keys: -1}
			for _, k := range keys {
				s.InFlight += st.ByKey[k.ID]
				limit := limitOf(k.MaxConcurrentRequests)
				if l, ok := learned[k.ID]; ok {
					limit = l.Limit
				}
				s.Limit = addLimits(s.Limit, limit)
			}
			return s
		})
	}
	return p
}

// Trace returns the Trace that counts a request for model: attach it to
// the request's context with pacing.WithTrace, beside the program's own.
// It is made once per cap; Trace allocates nothing.
func (p *Provider) Trace(model string) *pacing.Trace {
	if tr, ok := p.traces[model]; ok {
		return tr
	}
	return p.trace
}

// Snapshot returns what a scrape reads of the cap named capName
// ("provider", "model:glm-5", ...), with its Counts; false if the Provider
// has no such cap. For a program's own reports (the requests a cap turned
// away, say) and other exporters.
func (p *Provider) Snapshot(capName string) (Snapshot, bool) {
	c, ok := p.byName[capName]
	if !ok {
		return Snapshot{}, false
	}
	return c.snapshot(), true
}

// Describe implements prometheus.Collector.
func (p *Provider) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range p.all {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (p *Provider) Collect(ch chan<- prometheus.Metric) {
	for _, c := range p.all {
		c.Collect(ch)
	}
}

// newCap returns the counts of the cap named name, whose other figures
// read takes from the Gate's Status at each scrape; with rejections false
// it counts none and exports none (a cap that never refuses).
func (p *Provider) newCap(name string, rejections bool, read func(pacing.Status, *capCounts) Snapshot) *capCounts {
	c := &capCounts{c: New(name)}
	if rejections {
		c.rejects = make(map[string]*atomic.Uint64, len(RejectReasons))
		for _, r := range RejectReasons {
			c.rejects[r] = new(atomic.Uint64)
		}
	}
	c.snapshot = func() Snapshot {
		s := read(p.gate.Status(), c)
		s.Counts = c.counts()
		return s
	}
	Watch(c.c, c.snapshot)
	p.all = append(p.all, c.c)
	p.byName[name] = c
	return c
}

// newTrace returns the Trace of requests for the model whose counts are m.
func (p *Provider) newTrace(m *capCounts) *pacing.Trace {
	waited := func() {
		m.fleetWaiting.Add(-1)
		p.provider.fleetWaiting.Add(-1)
	}
	return &pacing.Trace{
		FleetWait: func() func() {
			m.fleetWaiting.Add(1)
			p.provider.fleetWaiting.Add(1)
			return waited
		},
		Admitted: func(a pacing.Admission) {
			bypassed := a.Held.Bypassed()
			p.held(a, m, func(c *capCounts) { c.admitted(a.Wait, bypassed) })
		},
		Released: func(a pacing.Admission, held time.Duration) {
			p.held(a, m, func(c *capCounts) { c.released(held) })
		},
		Refused: func(err error) { p.refusedBy(err, m).rejected(p.reasonOf(err)) },
	}
}

// held calls f with the counts of each cap a's request holds: the
// provider's, its model's (m), and its API key's if it was given one.
func (p *Provider) held(a pacing.Admission, m *capCounts, f func(*capCounts)) {
	f(p.provider)
	f(m)
	if k := p.keys[a.Grant.Key]; k != nil {
		f(k)
	}
}

// refusedBy returns the counts a refusal is counted under: the model's (m)
// for its model's caps and budgets, the pool's when no key could take it,
// else the provider's.
func (p *Provider) refusedBy(err error, m *capCounts) *capCounts {
	var le *slots.LimitError
	if errors.As(err, &le) {
		switch {
		case le.Cap == pacing.CapModel, strings.HasPrefix(le.Cap, "model_"), le.Cap == "" && strings.HasPrefix(le.Key, "model:"):
			return m
		case (le.Cap == pacing.CapAPIKey || strings.HasPrefix(le.Cap, "api_key_")) && p.pool != nil: // full, or their budgets
			return p.pool
		}
	}
	return p.provider
}

// reasonOf names a refusal as RejectReason does, or by WithRejectReason's
// function for one RejectReason does not know.
func (p *Provider) reasonOf(err error) string {
	r := RejectReason(err)
	if r == "other" && p.reason != nil {
		if named := p.reason(err); named != "" {
			return named
		}
	}
	return r
}

// RejectReason names a refusal as a Provider's inflight_rejected_total
// does: "limit_reached", "queue_full", "wait_timeout", "exceeds_limit",
// "over_budget", "canceled" (the context ended), or "other" for an error
// it does not know (see WithRejectReason).
func RejectReason(err error) string {
	switch {
	case errors.Is(err, slots.ErrLimitReached):
		return "limit_reached"
	case errors.Is(err, slots.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, slots.ErrWaitTimeout):
		return "wait_timeout"
	case errors.Is(err, slots.ErrExceedsLimit):
		return "exceeds_limit"
	case errors.Is(err, pacing.ErrOverBudget):
		return "over_budget"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "other"
}

// capCounts counts one cap's admissions, releases and refusals through the
// Transport, which feed its Collector, and the requests waiting for a
// fleet's caps.
type capCounts struct {
	c                            *Collector
	snapshot                     func() Snapshot
	acquires, bypasses, releases atomic.Uint64
	rejects                      map[string]*atomic.Uint64 // by reason; read-only; nil: none counted
	fleetWaiting                 atomic.Int64
}

// admitted counts a grant: a bypass (fail-open, no slot) has neither a
// wait for capacity nor a hold to observe.
func (c *capCounts) admitted(wait time.Duration, bypassed bool) {
	if bypassed {
		c.bypasses.Add(1)
		return
	}
	c.acquires.Add(1)
	c.c.ObserveWait(wait)
}

func (c *capCounts) released(held time.Duration) {
	c.releases.Add(1)
	c.c.ObserveHold(held)
}

func (c *capCounts) rejected(reason string) {
	if c.rejects == nil {
		return // a cap that counts none (refusedBy never names it)
	}
	n := c.rejects[reason]
	if n == nil {
		n = c.rejects["other"]
	}
	n.Add(1)
}

func (c *capCounts) counts() *Counts {
	n := &Counts{Acquired: c.acquires.Load(), Bypassed: c.bypasses.Load(), Released: c.releases.Load()}
	if c.rejects != nil {
		n.Rejected = make(map[string]uint64, len(c.rejects))
		for r, v := range c.rejects {
			n.Rejected[r] = v.Load()
		}
	}
	return n
}

// limitOf turns a Config's cap (0: none) into a limit.
func limitOf(n int) int {
	if n <= 0 {
		return slots.Unlimited
	}
	return n
}

// addLimits adds two limits; with one slots.Unlimited, the sum is too.
func addLimits(a, b int) int {
	if a > slots.Unlimited-b {
		return slots.Unlimited
	}
	return a + b
}
