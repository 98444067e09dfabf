package gateway

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// rejectReasons are the reasons a provider wait can end without a slot.
var rejectReasons = []string{"limit_reached", "queue_full", "wait_timeout", "unavailable", "canceled", "other"}

// capMetrics counts the provider cap's admissions, which the Gate does not
// report to an Observer: acquisitions with their wait, releases with their
// hold, rejections by reason.
type capMetrics struct {
	c                  *inflightprom.Collector
	acquires, releases atomic.Uint64
	rejects            map[string]*atomic.Uint64 // by reason; read-only after New
}

func newCapMetrics(c *inflightprom.Collector) *capMetrics {
	m := &capMetrics{c: c, rejects: make(map[string]*atomic.Uint64, len(rejectReasons))}
	for _, r := range rejectReasons {
		m.rejects[r] = new(atomic.Uint64)
	}
	return m
}

func (m *capMetrics) acquired(wait time.Duration) {
	m.acquires.Add(1)
	m.c.ObserveWait(wait)
}

func (m *capMetrics) released(hold time.Duration) {
	m.releases.Add(1)
	m.c.ObserveHold(hold)
}

func (m *capMetrics) rejected(err error) { m.rejects[rejectReason(err)].Add(1) }

func (m *capMetrics) counts() *inflightprom.Counts {
	n := &inflightprom.Counts{Acquired: m.acquires.Load(), Released: m.releases.Load(), Rejected: make(map[string]uint64, len(m.rejects))}
	for r, v := range m.rejects {
		n.Rejected[r] = v.Load()
	}
	return n
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
// "model:<name>" for each capped model and "api_key:<id>" for each key of
// the pool; the fleet's state when there is one; and the Go runtime's and
// the process's collectors.
func (g *Gateway) registerMetrics(cfg Config) {
	g.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	pc := inflightprom.New("provider")
	g.provider = newCapMetrics(pc)
	providerLimit := limitOrUnlimited(cfg.Provider.MaxConcurrentRequests)
	inflightprom.Watch(pc, func() inflightprom.Snapshot {
		st := g.gate.Status()
		waiting := st.Queued
		if g.caps != nil {
			waiting += g.caps.Stats().Waiting // waiting for the fleet's provider and model caps
		}
		return inflightprom.Snapshot{InFlight: st.InFlight, Waiting: waiting, Keys: -1, Limit: providerLimit, Counts: g.provider.counts()}
	})
	g.metrics.MustRegister(pc)

	// Models and API keys: in flight and limit; their waiters are counted
	// in the provider's.
	for name, m := range cfg.Provider.Models {
		if m.MaxConcurrentRequests <= 0 {
			continue
		}
		c := inflightprom.New("model:" + name)
		limit := m.MaxConcurrentRequests
		inflightprom.Watch(c, func() inflightprom.Snapshot {
			return inflightprom.Snapshot{InFlight: g.gate.Status().ByModel[name], Waiting: -1, Keys: -1, Limit: limit}
		})
		g.metrics.MustRegister(c)
	}
	for _, k := range cfg.Provider.APIKeys {
		c := inflightprom.New("api_key:" + k.ID)
		limit := limitOrUnlimited(k.MaxConcurrentRequests)
		inflightprom.Watch(c, func() inflightprom.Snapshot {
			return inflightprom.Snapshot{InFlight: g.gate.Status().ByKey[k.ID], Waiting: -1, Keys: -1, Limit: limit}
		})
		g.metrics.MustRegister(c)
	}

	if g.fleetTenants != nil {
		registerFleet(g.metrics, "tenants", g.fleetTenants.Stats)
		registerFleet(g.metrics, "provider", g.caps.Stats)
	}
}

// registerFleet exports a fleet registry's state under the label fleet.
func registerFleet(reg *prometheus.Registry, name string, stats func() fleet.Stats) {
	labels := prometheus.Labels{"fleet": name}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "inflight_fleet_degraded", ConstLabels: labels,
			Help: "1 while Redis is considered unreachable and admissions follow on_unavailable, else 0.",
		}, func() float64 {
			if stats().BreakerOpen {
				return 1
			}
			return 0
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "inflight_fleet_degraded_admissions_total", ConstLabels: labels,
			Help: "Admissions under this process's local caps alone, Redis being unreachable.",
		}, func() float64 { return float64(stats().Degraded) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "inflight_fleet_redis_errors_total", ConstLabels: labels,
			Help: "Failed calls to Redis.",
		}, func() float64 { return float64(stats().RedisErrors) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "inflight_fleet_held", ConstLabels: labels,
			Help: "Leases this process holds now.",
		}, func() float64 { return float64(stats().Held) }),
	)
}
