package gateway

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// rejectReasons are the reasons a provider wait can end without a slot.
var rejectReasons = []string{"limit_reached", "queue_full", "wait_timeout", "exceeds_limit", "over_budget", "unavailable", "canceled", "other"}

// capMetrics counts one cap's admissions through the provider's wait, which
// the Gate does not report to an Observer: acquisitions with their wait,
// bypasses, releases with their hold, rejections by reason, and the
// requests waiting for the fleet's caps.
type capMetrics struct {
	c                            *inflightprom.Collector
	acquires, bypasses, releases atomic.Uint64
	rejects                      map[string]*atomic.Uint64 // by reason; read-only after New; nil: none counted
	fleetWaiting                 atomic.Int64              // requests waiting for the fleet's caps now
}

// newCapMetrics returns a cap's counts; with countsRejections false it
// counts no rejections and exports none (a cap that never sees them).
func newCapMetrics(c *inflightprom.Collector, countsRejections bool) *capMetrics {
	m := &capMetrics{c: c}
	if countsRejections {
		m.rejects = make(map[string]*atomic.Uint64, len(rejectReasons))
		for _, r := range rejectReasons {
			m.rejects[r] = new(atomic.Uint64)
		}
	}
	return m
}

// admitted counts a grant: a bypass (fail-open, no slot) has neither a
// wait for capacity nor a hold to observe.
func (m *capMetrics) admitted(wait time.Duration, bypassed bool) {
	if bypassed {
		m.bypasses.Add(1)
		return
	}
	m.acquires.Add(1)
	m.c.ObserveWait(wait)
}

func (m *capMetrics) released(hold time.Duration) {
	m.releases.Add(1)
	m.c.ObserveHold(hold)
}

func (m *capMetrics) rejected(err error) { m.rejects[rejectReason(err)].Add(1) }

func (m *capMetrics) counts() *inflightprom.Counts {
	n := &inflightprom.Counts{Acquired: m.acquires.Load(), Bypassed: m.bypasses.Load(), Released: m.releases.Load()}
	if m.rejects != nil {
		n.Rejected = make(map[string]uint64, len(m.rejects))
		for r, v := range m.rejects {
			n.Rejected[r] = v.Load()
		}
	}
	return n
}

// capRefused returns the counts a refusal by the provider's cap named
// capName is counted under: the model's (mm) for its model's cap, the key
// pool's for the pool's, else the provider's (its cap, its queue, its
// pacing and pauses).
func (g *Gateway) capRefused(capName string, mm *capMetrics) *capMetrics {
	switch {
	case capName == pacing.CapModel, strings.HasPrefix(capName, "model_"): // its tokens, its budgets
		return mm
	case capName == pacing.CapAPIKey && g.keyPool != nil:
		return g.keyPool
	}
	return g.provider
}

// modelMetrics returns the counts of model's cap: its own when the config
// names it, else the one that all unnamed models share, so that model
// names taken from request bodies cannot multiply the series.
func (g *Gateway) modelMetrics(model string) *capMetrics {
	if m, ok := g.models[model]; ok {
		return m
	}
	return g.otherModels
}

// addLimits adds two limits; with one slots.Unlimited, the sum is too.
func addLimits(a, b int) int {
	if a > slots.Unlimited-b {
		return slots.Unlimited
	}
	return a + b
}

// limitOrUnlimited turns a config's cap (0: none) into a limit.
func limitOrUnlimited(n int) int {
	if n <= 0 {
		return slots.Unlimited
	}
	return n
}

// registerMetrics exports every cap as series of the inflight_* families,
// told apart by the label cap: "tenant" (registered by New), "provider",
// "model:<name>" for each model the config names, "model:other" for all
// other models together (model names come from request bodies: one series
// each would let clients add series at will), and "api_key:<id>" for each
// key of the pool; the fleet's state when there is one; and the Go
// runtime's and the process's collectors. The provider's learned caps, with
// provider.adaptive or a model's adaptive section, are inflight_learned_*
// series labelled provider="provider" and cap as above, beside the
// upstream's answers by kind (inflight_upstream_answers_total); each change
// of a learned cap is also logged (logging.go).
//
// What each cap counts: a model's waiting are the requests for it in the
// provider's queue (and, with a fleet, waiting for the shared caps). A
// refusal is counted once, under the cap that refused it (refusedBy): a
// model's cap, the key pool ("api_keys", when there is one), else the
// provider (its cap, its queue's bounds, its pacing and pauses, a client
// that left while waiting). An API key is chosen when a request starts,
// never while it waits, so each key's series have no waiting and no
// rejections; the pool's have its refusals. With metrics.per_org,
// inflight_org_rejected_total counts refusals by org, cap and reason.
func (g *Gateway) registerMetrics(cfg Config) {
	g.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	pc := inflightprom.New("provider")
	g.provider = newCapMetrics(pc, true)
	counts := g.providerCounts(cfg)
	inflightprom.Watch(pc, func() inflightprom.Snapshot {
		n, waiting, limit := counts()
		return inflightprom.Snapshot{InFlight: n, Waiting: waiting, Keys: -1, Limit: limit, Counts: g.provider.counts()}
	})
	g.metrics.MustRegister(pc)
	// Read from the Gate at each scrape: the Gate's one change hook is left
	// to the log.
	g.metrics.MustRegister(inflightprom.NewLearnedCaps("provider", g))
	g.logLimitChanges()

	// Models: the Gate's counts per model, summed for the unnamed ones.
	g.models = make(map[string]*capMetrics, len(cfg.Provider.Models))
	watchModels := func(m *capMetrics, limit func() int, mine func(model string) bool) {
		inflightprom.Watch(m.c, func() inflightprom.Snapshot {
			st := g.gate.Status()
			s := inflightprom.Snapshot{Waiting: int(m.fleetWaiting.Load()), Keys: -1, Limit: limit(), Counts: m.counts()}
			for model, n := range st.ByModel {
				if mine(model) {
					s.InFlight += n
				}
			}
			for model, n := range st.WaitingByModel {
				if mine(model) {
					s.Waiting += n
				}
			}
			return s
		})
		g.metrics.MustRegister(m.c)
	}
	for name, mc := range cfg.Provider.Models {
		m := newCapMetrics(inflightprom.New("model:"+name), true)
		g.models[name] = m
		configured := limitOrUnlimited(mc.MaxConcurrentRequests)
		limit := func() int {
			if l, learned := g.Learned().Models[name]; learned {
				return l.Limit
			}
			return configured
		}
		watchModels(m, limit, func(model string) bool { return model == name })
	}
	other := "model:other"
	if _, named := cfg.Provider.Models["other"]; named {
		other = "model:other (unnamed)" // a model called "other" keeps "model:other"
	}
	g.otherModels = newCapMetrics(inflightprom.New(other), true)
	watchModels(g.otherModels, func() int { return slots.Unlimited }, func(model string) bool { _, named := g.models[model]; return !named })

	g.keys = make(map[string]*capMetrics, len(cfg.Provider.APIKeys))
	for _, k := range cfg.Provider.APIKeys {
		m := newCapMetrics(inflightprom.New("api_key:"+k.ID), false)
		g.keys[k.ID] = m
		configured := limitOrUnlimited(k.MaxConcurrentRequests)
		inflightprom.Watch(m.c, func() inflightprom.Snapshot {
			limit := configured
			if l, learned := g.gate.Learned().Keys[k.ID]; learned {
				limit = l.Limit
			}
			return inflightprom.Snapshot{InFlight: g.gate.Status().ByKey[k.ID], Waiting: -1, Keys: -1, Limit: limit, Counts: m.counts()}
		})
		g.metrics.MustRegister(m.c)
	}

	if len(cfg.Provider.APIKeys) > 0 {
		// The pool as a whole: a request waits for any of its keys, so a
		// refusal because none had room is the pool's.
		g.keyPool = newCapMetrics(inflightprom.New("api_keys"), true)
		inflightprom.Watch(g.keyPool.c, func() inflightprom.Snapshot {
			st, learned := g.gate.Status(), g.gate.Learned().Keys
			s := inflightprom.Snapshot{Waiting: -1, Keys: -1, Counts: g.keyPool.counts()}
			for _, k := range cfg.Provider.APIKeys {
				s.InFlight += st.ByKey[k.ID]
				limit := limitOrUnlimited(k.MaxConcurrentRequests)
				if l, ok := learned[k.ID]; ok {
					limit = l.Limit
				}
				s.Limit = addLimits(s.Limit, limit)
			}
			return s
		})
		g.metrics.MustRegister(g.keyPool.c)
	}
	if cfg.Metrics != nil && cfg.Metrics.PerOrg {
		g.orgRejections = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inflight_org_rejected_total",
			Help: "Requests refused, by the org (X-Org-ID) they were for, the cap that refused them and why " +
				"(metrics.per_org: one series per org that was ever refused).",
		}, []string{"org", "cap", "reason"})
		g.metrics.MustRegister(g.orgRejections)
	}

	if capsTokens(cfg.Provider) {
		g.registerTokens(cfg)
	}
	if g.budgets || g.fleetBudgets != nil && (g.fleetBudgets.provider != nil || len(g.fleetBudgets.models) > 0) {
		g.registerBudgets()
	}
	if g.fleetTenants != nil {
		onUnavailable, _ := fleet.ParseUnavailable(cfg.Fleet.OnUnavailable) // checked by ParseConfig
		registerFleet(g.metrics, "tenants", g.fleetTenants.Stats, onUnavailable)
		registerFleet(g.metrics, "provider", g.caps.Stats, onUnavailable)
	}
}

// providerCounts returns what reads the provider's slots held, the
// requests waiting for them (for the Gate, and with a fleet for the
// fleet's provider and model caps) and the limit in force.
func (g *Gateway) providerCounts(cfg Config) func() (inFlight, waiting, limit int) {
	configured := limitOrUnlimited(cfg.Provider.MaxConcurrentRequests)
	return func() (inFlight, waiting, limit int) {
		st := g.gate.Status()
		waiting = st.Queued
		if g.caps != nil {
			waiting += g.caps.Stats().Waiting
		}
		limit = configured
		if l := g.Learned(); l.Floor > 0 { // the provider's cap is learned: the limit in force
			limit = l.Limit
		}
		return st.InFlight, waiting, limit
	}
}

// registerFleet exports a fleet registry's state under the label fleet;
// onUnavailable is what its admissions do while the fleet's store is unavailable.
func registerFleet(reg *prometheus.Registry, name string, stats func() fleet.Stats, onUnavailable fleet.Unavailable) {
	labels := prometheus.Labels{"fleet": name}
	unavailable := func() float64 {
		if stats().BreakerOpen {
			return 1
		}
		return 0
	}
	degraded := unavailable
	if onUnavailable == fleet.FailClosed {
		degraded = func() float64 { return 0 } // it refuses instead
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "inflight_fleet_redis_unavailable", ConstLabels: labels,
			Help: "1 while the fleet's store is held to be unavailable: from 3 failed calls in a row until a probe " +
				"(one every 250 ms) is answered, admissions do not call it; else 0.",
		}, unavailable),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "inflight_fleet_degraded", ConstLabels: labels,
			Help: "1 while every admission is degraded: the fleet's store is unavailable and on_unavailable admits without it " +
				"(local: under this process's caps alone; open: without a slot); else 0, and always 0 with " +
				"on_unavailable closed, which refuses admissions instead (answered 503). " +
				"Before that, an admission whose own call fails is degraded alone, unless it waits for the provider " +
				"and its call timed out: it asks again (with local, counted by inflight_fleet_degraded_admissions_total).",
		}, degraded),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "inflight_fleet_degraded_admissions_total", ConstLabels: labels,
			Help: "Admissions under this process's local caps alone, the fleet's store being unreachable.",
		}, func() float64 { return float64(stats().Degraded) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "inflight_fleet_store_errors_total", ConstLabels: labels,
			Help: "Failed calls to the fleet's store.",
		}, func() float64 { return float64(stats().StoreErrors) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "inflight_fleet_held", ConstLabels: labels,
			Help: "Leases this process holds now.",
		}, func() float64 { return float64(stats().Held) }),
	)
}

// capsHeld names the caps an admission for model holds, as the access log
// lists them: the tenant's, the provider's, its model's when the config
// names the model, its API key's when it was given one.
func (g *Gateway) capsHeld(a pacing.Admission, model string) []string {
	caps := []string{"tenant", "provider"}
	if _, named := g.models[model]; named {
		caps = append(caps, "model:"+model)
	}
	if a.Grant.Key != "" {
		caps = append(caps, "api_key:"+a.Grant.Key)
	}
	return caps
}

// heldBy returns the metrics of the caps an admission holds: the
// provider's, its model's (mm), and its API key's when it was given one.
func (g *Gateway) heldBy(a pacing.Admission, mm *capMetrics) []*capMetrics {
	if km := g.keys[a.Grant.Key]; km != nil {
		return []*capMetrics{g.provider, mm, km}
	}
	return []*capMetrics{g.provider, mm}
}
