// Package inflightprom exports a Limiter's or a Registry's counts to
// Prometheus. It lives apart from the core packages so that a program that
// does not use Prometheus never compiles its client.
//
//	c := inflightprom.New("tenant")
//	reg := registry.New[string](64, registry.WithObserver(c))
//	inflightprom.WatchRegistry(c, reg)
//	prometheus.MustRegister(c)
//
// Every metric is named inflight_<name>_<metric> and carries no key label
// (keys are tenants, models, API keys: too many, and sometimes sensitive):
//
//	in_flight             gauge     slots held now (a multi-key slot counts per key)
//	waiting               gauge     callers waiting now
//	keys                  gauge     keys tracked now (registry only)
//	limit                 gauge     the limit (limiter only)
//	acquired_total        counter   admissions that took capacity
//	rejected_total        counter   rejections, by reason: limit_reached, queue_full,
//	                                wait_timeout, canceled, invalid_key
//	bypassed_total        counter   fail-open admissions without a slot
//	released_total        counter   capacity given back
//	double_releases_total counter   Release calls on a slot already released
//	wait_seconds          histogram how long admitted callers queued (0 for most)
//	hold_seconds          histogram how long slots were held
//
// The gauges and counters are read from Stats at each scrape; the histograms
// are fed by the Collector's Observe, which the limiter or registry calls
// when the Collector is its Observer.
package inflightprom

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Collector is a prometheus.Collector and a slots.Observer. Create it with
// New; the zero value is not usable.
type Collector struct {
	stats atomic.Pointer[func() snapshot]

	inFlight, waiting, keys, limit *prometheus.Desc
	acquired, rejected, bypassed   *prometheus.Desc
	released, doubleReleases       *prometheus.Desc
	waitSeconds, holdSeconds       prometheus.Histogram
}

var (
	_ prometheus.Collector = (*Collector)(nil)
	_ slots.Observer       = (*Collector)(nil)
)

// snapshot is what a scrape reads; hasKeys and hasLimit say which of the
// two source-specific gauges apply.
type snapshot struct {
	inFlight, waiting, keys, limit                  int
	hasKeys, hasLimit                               bool
	acquired, bypassed, released, doubles           uint64
	limitReached, queueFull, waitTimeouts, canceled uint64
	invalidKeys                                     uint64
}

// New returns a Collector whose metrics are named inflight_<name>_*. Point
// it at its source with WatchLimiter or WatchRegistry, and make it the
// source's Observer for the wait and hold histograms.
func New(name string) *Collector {
	fq := func(m string) string { return prometheus.BuildFQName("inflight", name, m) }
	desc := func(m, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(fq(m), help, labels, nil)
	}
	return &Collector{
		inFlight:       desc("in_flight", "Slots held now; a slot held under several keys counts once per key."),
		waiting:        desc("waiting", "Callers waiting for a slot now."),
		keys:           desc("keys", "Keys tracked now: with a holder or a waiter."),
		limit:          desc("limit", "The limit."),
		acquired:       desc("acquired_total", "Admissions that took capacity."),
		rejected:       desc("rejected_total", "Rejections, by reason.", "reason"),
		bypassed:       desc("bypassed_total", "Fail-open admissions without a slot."),
		released:       desc("released_total", "Capacity given back."),
		doubleReleases: desc("double_releases_total", "Release calls on a slot already released."),
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    fq("wait_seconds"),
			Help:    "How long admitted callers queued for their slot.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14), // 5 ms to 41 s
		}),
		holdSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    fq("hold_seconds"),
			Help:    "How long slots were held.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16), // 50 ms to 27 min
		}),
	}
}

// WatchLimiter makes c report l's counts.
func WatchLimiter(c *Collector, l *slots.Limiter) {
	f := func() snapshot {
		st := l.Stats()
		return snapshot{
			inFlight: st.InFlight, waiting: st.Waiting, limit: st.Limit, hasLimit: true,
			acquired: st.Acquired, bypassed: st.Bypassed, released: st.Released, doubles: st.DoubleReleases,
			limitReached: st.LimitReached, queueFull: st.QueueFull, waitTimeouts: st.WaitTimeouts, canceled: st.Canceled,
		}
	}
	c.stats.Store(&f)
}

// WatchRegistry makes c report r's counts.
func WatchRegistry[K comparable](c *Collector, r *registry.Registry[K]) {
	f := func() snapshot {
		st := r.Stats()
		return snapshot{
			inFlight: st.InFlight, waiting: st.Waiting, keys: st.Keys, hasKeys: true,
			acquired: st.Acquired, bypassed: st.Bypassed, released: st.Released, doubles: st.DoubleReleases,
			limitReached: st.LimitReached, queueFull: st.QueueFull, waitTimeouts: st.WaitTimeouts, canceled: st.Canceled,
			invalidKeys: st.InvalidKeys,
		}
	}
	c.stats.Store(&f)
}

// Observe implements slots.Observer: it feeds the wait and hold histograms.
func (c *Collector) Observe(e slots.Event) {
	switch e.Kind {
	case slots.EventAcquired:
		c.waitSeconds.Observe(e.Wait.Seconds())
	case slots.EventReleased:
		c.holdSeconds.Observe(e.Hold.Seconds())
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inFlight, c.waiting, c.keys, c.limit, c.acquired, c.rejected, c.bypassed, c.released, c.doubleReleases} {
		ch <- d
	}
	c.waitSeconds.Describe(ch)
	c.holdSeconds.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.waitSeconds.Collect(ch)
	c.holdSeconds.Collect(ch)
	f := c.stats.Load()
	if f == nil {
		return // not watching anything yet
	}
	s := (*f)()
	gauge := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.inFlight, s.inFlight)
	gauge(c.waiting, s.waiting)
	if s.hasKeys {
		gauge(c.keys, s.keys)
	}
	if s.hasLimit {
		gauge(c.limit, s.limit)
	}
	counter(c.acquired, s.acquired)
	counter(c.rejected, s.limitReached, "limit_reached")
	counter(c.rejected, s.queueFull, "queue_full")
	counter(c.rejected, s.waitTimeouts, "wait_timeout")
	counter(c.rejected, s.canceled, "canceled")
	if s.hasKeys {
		counter(c.rejected, s.invalidKeys, "invalid_key")
	}
	counter(c.bypassed, s.bypassed)
	counter(c.released, s.released)
	counter(c.doubleReleases, s.doubles)
}
