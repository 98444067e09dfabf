package gateway

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// watchTenants exports the tenant cap, whose Observer c is: its registry's
// counts, but for the refusals, counted as they are answered (rejectTenant,
// and those of orgs switched off before the cap or over their budgets
// after it: rejectDisabled, rejectBudget); with a fleet, the store refuses
// without the registry's knowing.
func (g *Gateway) watchTenants(c *inflightprom.Collector) {
	inflightprom.Watch(c, func() inflightprom.Snapshot {
		s := inflightprom.RegistrySnapshot(g.tenants)
		for reason := range s.Counts.Rejected {
			s.Counts.Rejected[reason] = 0 // the registry's: with a fleet, the store's refusals are not among them
		}
		s.Counts.Rejected["over_budget"] = 0
		g.tenantRefused.into(s.Counts.Rejected)
		return s
	})
	g.metrics.MustRegister(c)
}

// registerMetrics exports every cap as series of the inflight_* families,
// told apart by the label cap: "tenant" (registered by New); the provider's
// caps as inflightprom.Provider names and counts them ("provider",
// "model:<name>" for each model the config names, "model:other" for the
// others together, "api_key:<id>" and "api_keys"), a refusal once under the
// cap that refused it; the fleet's state when there is one; and the Go
// runtime's and the process's collectors. The provider's learned caps, with
// provider.adaptive or a model's adaptive section, are inflight_learned_*
// series labelled provider="provider" and cap as above, beside the
// upstream's answers by kind (inflight_upstream_answers_total); each change
// of a learned cap is also logged (logging.go). With metrics.per_org,
// inflight_org_rejected_total counts refusals by org, cap and reason.
func (g *Gateway) registerMetrics(cfg Config) {
	g.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// The provider's caps, its models' and its keys', counted from the
	// Trace each request is sent with (see model).
	g.prom = inflightprom.NewProvider(g.gate, cfg.Provider, inflightprom.WithLearner(g),
		inflightprom.WithRejectReason(rejectReason))
	g.metrics.MustRegister(g.prom)
	g.named = make(map[string]struct{}, len(cfg.Provider.Models))
	for name := range cfg.Provider.Models {
		g.named[name] = struct{}{}
	}
	// Read from the Gate at each scrape: the Gate's one change hook is left
	// to the log.
	g.metrics.MustRegister(inflightprom.NewLearnedCaps("provider", g))
	g.logLimitChanges()

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
	if _, named := g.named[model]; named {
		caps = append(caps, "model:"+model)
	}
	if a.Grant.Key != "" {
		caps = append(caps, "api_key:"+a.Grant.Key)
	}
	return caps
}

// refusalCounts counts a cap's refusals by reason (rejectReason) as they
// are answered.
type refusalCounts struct {
	mu sync.Mutex
	by map[string]uint64
}

func (c *refusalCounts) add(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.by == nil {
		c.by = map[string]uint64{}
	}
	c.by[reason]++
}

// into writes the counts into m.
func (c *refusalCounts) into(m map[string]uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for reason, n := range c.by {
		m[reason] = n
	}
}
