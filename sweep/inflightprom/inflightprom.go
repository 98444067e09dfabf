// Package inflightprom exports the counts of a program's caps to
// Prometheus: each cap (a Limiter, a Registry, or any other source) is one
// Collector, and every cap's series belong to the same metric families,
// told apart by the label cap. It lives apart from the core packages so
// that a program that does not use Prometheus never compiles its client.
//
//	tenants := inflightprom.New("tenant")
//	reg := registry.New[string](64, slots.WithObserver(tenants))
//	inflightprom.WatchRegistry(tenants, reg)
//	prometheus.MustRegister(tenants)
//
// The families, each with the label cap and no key label (keys are
// tenants, models, API keys: too many, and sometimes sensitive):
//
//	inflight_in_flight             gauge     units held now (a slot weighs its units; per key)
//	inflight_waiting               gauge     callers waiting now
//	inflight_keys                  gauge     keys tracked now (registries)
//	inflight_limit                 gauge     the limit (one-pool caps; +Inf when unlimited)
//	inflight_acquired_total        counter   admissions that took capacity
//	inflight_rejected_total        counter   rejections, by reason: limit_reached, queue_full,
//	                                         exceeds_limit, wait_timeout, canceled, invalid_key
//	                                         (a Provider's caps: RejectReasons)
//	inflight_bypassed_total        counter   fail-open admissions without a slot
//	inflight_released_total        counter   capacity given back
//	inflight_double_releases_total counter   Release calls on a slot already released
//	inflight_leaked_total          counter   slots dropped while held, and reclaimed
//	inflight_wait_seconds          histogram how long admitted callers queued (0 for most)
//	inflight_hold_seconds          histogram how long slots were held
//
// The gauges and counters are read from the source at each scrape; the
// histograms are fed by the Collector's Observe, which a limiter or registry
// calls when the Collector is its Observer, or by ObserveWait and
// ObserveHold for a source without one, and appear from their first
// observation on.
//
// Each call with a valid weight and context counts once among acquired,
// bypassed and rejected (one without is refused before it is counted). A
// grant whose caller's context ends as it comes is given back at once: it
// counts as acquired and released (the capacity was taken and freed), not
// as canceled, so that the counters never go back, and it is not in the
// wait histogram; the OpenTelemetry adapter, which counts what callers
// were told, counts it as canceled.
//
// # A provider's caps
//
// A Provider exports the caps a pacing.Transport admits requests under,
// one cap label each ("provider", "model:<name>", "model:other",
// "api_key:<id>", "api_keys"), counted from the Trace each request carries:
//
//	caps := inflightprom.NewProvider(gate, cfg)
//	prometheus.MustRegister(caps)
//	ctx = pacing.WithTrace(ctx, caps.Trace(model)) // for each request
//
// # Learned caps
//
// A pacing.Gate that learns its upstream's concurrency caps is exported by
// a LearnedCaps, read from Gate.Learned at each scrape:
//
//	gate.Report(grant, pacing.Classify(resp, nil)) // for each answer, as the Gate's docs say
//	prometheus.MustRegister(inflightprom.NewLearnedCaps("zai", gate))
//
// Its families carry the label provider; those of a cap the label cap as
// well ("provider" for the provider's own, "model:<name>", "api_key:<id>"),
// one per cap that the Gate's config makes learn:
//
//	inflight_learned_limit          gauge   the limit admissions run under now (the floor while a cut is tested)
//	inflight_learned_cap            gauge   the learned cap
//	inflight_learned_ceiling        gauge   the cap is at most this, as last seen
//	inflight_learned_floor          gauge   the lowest the cap may go, as configured
//	inflight_learned_max            gauge   the highest the cap may go, as configured
//	inflight_learned_changes_total  counter changes of the cap or its ceiling
//	inflight_upstream_answers_total counter answers reported, one per grant, by kind: admitted,
//	                                        concurrency, rate, overload, quota, other (no cap label)
//
// Each change of a cap, with its evidence, is an event for
// Gate.OnLimitChange, which this adapter leaves to the program.
//
// # Budgets per minute
//
// A Budgets exports budgets per minute, read at each scrape: a Gate's
// (GateBudgets), and any of the program's own (a tenant's pacing.Budget, a
// fleet's):
//
//	prometheus.MustRegister(inflightprom.NewBudgets(func() []inflightprom.Budget {
//		return inflightprom.GateBudgets(gate)
//	}))
//
//	inflight_budget_tokens_left     gauge tokens left over the last minute (below 0 in debt), by cap and budget
//	inflight_budget_tokens_limit    gauge a token budget per minute, by cap and budget
//	inflight_budget_requests_left   gauge requests left over the last minute, by cap
//	inflight_budget_requests_limit  gauge a budget of requests per minute, by cap
package inflightprom

import (
	"math"
	"sync/atomic"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Snapshot is what a scrape reads from a source. A negative InFlight,
// Waiting, Keys or Limit is not known for the source, and its series is
// left out; a Limit of slots.Unlimited is exported as +Inf.
type Snapshot struct {
	InFlight int
	Waiting  int
	Keys     int
	Limit    int
	// Counts are the totals since the source was made; nil leaves the
	// counter series out.
	Counts *Counts
}

// Counts are a source's totals.
type Counts struct {
	Acquired, Bypassed, Released, DoubleReleases uint64
	Leaked                                       uint64            // slots dropped while held and reclaimed
	Rejected                                     map[string]uint64 // by reason
}

// Collector is a prometheus.Collector and a slots.Observer for one cap.
// Create it with New; the zero value is not usable.
type Collector struct {
	source atomic.Pointer[func() Snapshot]
	fed    atomic.Bool // the histograms have had an observation

	inFlight, waiting, keys, limit *prometheus.Desc
	acquired, rejected, bypassed   *prometheus.Desc
	released, doubleReleases       *prometheus.Desc
	leaked                         *prometheus.Desc
	waitSeconds, holdSeconds       prometheus.Histogram
}

var (
	_ prometheus.Collector = (*Collector)(nil)
	_ slots.Observer       = (*Collector)(nil)
)

// New returns a Collector whose series carry the label cap=capName, for
// example "tenant", "provider", "model:glm-5". Collectors of different caps
// are registered side by side in one registry. Point it at its source with
// WatchLimiter, WatchRegistry or Watch.
func New(capName string) *Collector {
	labels := prometheus.Labels{"cap": capName}
	desc := func(m, help string, variable ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("inflight", "", m), help, variable, labels)
	}
	return &Collector{
		inFlight:       desc("in_flight", "Units held now (one per slot unless weighted); a slot held under several keys counts under each."),
		waiting:        desc("waiting", "Callers waiting for a slot now."),
		keys:           desc("keys", "Keys tracked now: with a holder or a waiter."),
		limit:          desc("limit", "The limit; +Inf when unlimited."),
		acquired:       desc("acquired_total", "Admissions that took capacity."),
		rejected:       desc("rejected_total", "Rejections, by reason.", "reason"),
		bypassed:       desc("bypassed_total", "Fail-open admissions without a slot."),
		released:       desc("released_total", "Capacity given back."),
		doubleReleases: desc("double_releases_total", "Release calls on a slot already released."),
		leaked:         desc("leaked_total", "Slots dropped while held, and reclaimed (leak detection on)."),
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "inflight_wait_seconds",
			Help:        "How long admitted callers queued for their slot.",
			ConstLabels: labels,
			Buckets:     prometheus.ExponentialBuckets(0.005, 2, 14), // 5 ms to 41 s
		}),
		holdSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:        "inflight_hold_seconds",
			Help:        "How long slots were held.",
			ConstLabels: labels,
			Buckets:     prometheus.ExponentialBuckets(0.05, 2, 16), // 50 ms to 27 min
		}),
	}
}

// Watch makes c report what f returns at each scrape. f is called from the
// scraping goroutine and may run concurrently with itself. A nil f stops
// watching: c then reports no source's series, as before its first Watch.
func Watch(c *Collector, f func() Snapshot) {
	if f == nil {
		c.source.Store(nil)
		return
	}
	c.source.Store(&f)
}

// WatchLimiter makes c report l's counts while l is in use: c does not
// keep l alive, and reports nothing of it once it is gone.
func WatchLimiter(c *Collector, l *slots.Limiter) {
	watchWeakly(c, l, func(l *slots.Limiter) Snapshot {
		st := l.Stats()
		return Snapshot{
			InFlight: st.InFlight, Waiting: st.Waiting, Keys: -1, Limit: st.Limit,
			Counts: &Counts{
				Acquired: st.Acquired, Bypassed: st.Bypassed, Released: st.Released, DoubleReleases: st.DoubleReleases,
				Leaked: st.Leaked,
				Rejected: map[string]uint64{
					"limit_reached": st.LimitReached, "queue_full": st.QueueFull, "exceeds_limit": st.ExceedsLimit,
					"wait_timeout": st.WaitTimeouts, "canceled": st.Canceled,
				},
			},
		}
	})
}

// WatchRegistry makes c report r's counts, as WatchLimiter does a
// Limiter's. A registry's limits are per key, so it has no limit series.
func WatchRegistry[K comparable](c *Collector, r *registry.Registry[K]) {
	watchWeakly(c, r, RegistrySnapshot[K])
}

// watchWeakly makes c report read(v) while v is in use, and nothing once
// it is gone.
func watchWeakly[T any](c *Collector, v *T, read func(*T) Snapshot) {
	wp := weak.Make(v)
	Watch(c, func() Snapshot {
		if v := wp.Value(); v != nil {
			return read(v)
		}
		return Snapshot{InFlight: -1, Waiting: -1, Keys: -1, Limit: -1}
	})
}

// RegistrySnapshot is what WatchRegistry reports of r now: for a source
// (Watch) that adds what is counted before r, such as refusals made
// ahead of it.
func RegistrySnapshot[K comparable](r *registry.Registry[K]) Snapshot {
	st := r.Stats()
	return Snapshot{
		InFlight: st.InFlight, Waiting: st.Waiting, Keys: st.Keys, Limit: -1,
		Counts: &Counts{
			Acquired: st.Acquired, Bypassed: st.Bypassed, Released: st.Released, DoubleReleases: st.DoubleReleases,
			Leaked: st.Leaked,
			Rejected: map[string]uint64{
				"limit_reached": st.LimitReached, "queue_full": st.QueueFull, "exceeds_limit": st.ExceedsLimit,
				"wait_timeout": st.WaitTimeouts, "canceled": st.Canceled, "invalid_key": st.InvalidKeys,
			},
		},
	}
}

// Observe implements slots.Observer: it feeds the wait and hold histograms.
func (c *Collector) Observe(e slots.Event) {
	switch e.Kind {
	case slots.EventAcquired:
		c.ObserveWait(e.Wait)
	case slots.EventReleased:
		c.ObserveHold(e.Hold)
	}
}

// ObserveWait records how long an admitted caller queued, for a source
// that has no Observer of its own.
func (c *Collector) ObserveWait(d time.Duration) {
	c.waitSeconds.Observe(d.Seconds())
	c.fed.Store(true)
}

// ObserveHold records how long a slot was held, for a source that has no
// Observer of its own.
func (c *Collector) ObserveHold(d time.Duration) {
	c.holdSeconds.Observe(d.Seconds())
	c.fed.Store(true)
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.inFlight, c.waiting, c.keys, c.limit, c.acquired, c.rejected, c.bypassed, c.released, c.doubleReleases, c.leaked} {
		ch <- d
	}
	c.waitSeconds.Describe(ch)
	c.holdSeconds.Describe(ch)
}

// Collect implements prometheus.Collector. The histograms appear once they
// have had an observation, so that a cap whose source does not feed them
// shows none rather than empty ones that read as "nothing waited".
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c.fed.Load() {
		c.waitSeconds.Collect(ch)
		c.holdSeconds.Collect(ch)
	}
	f := c.source.Load()
	if f == nil {
		return // not watching anything (yet, or any more)
	}
	s := (*f)()
	gauge := func(d *prometheus.Desc, v int) {
		if v >= 0 {
			ch <- constMetric(d, prometheus.GaugeValue, float64(v))
		}
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- constMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.inFlight, s.InFlight)
	gauge(c.waiting, s.Waiting)
	gauge(c.keys, s.Keys)
	if s.Limit == slots.Unlimited {
		ch <- constMetric(c.limit, prometheus.GaugeValue, math.Inf(1))
	} else {
		gauge(c.limit, s.Limit)
	}
	if n := s.Counts; n != nil {
		counter(c.acquired, n.Acquired)
		for reason, v := range n.Rejected {
			counter(c.rejected, v, reason)
		}
		counter(c.bypassed, n.Bypassed)
		counter(c.released, n.Released)
		counter(c.doubleReleases, n.DoubleReleases)
		counter(c.leaked, n.Leaked)
	}
}

// constMetric is prometheus.MustNewConstMetric without its panic. Collect
// runs on a registry's own goroutines, where a panic ends the process, and
// a label value Prometheus refuses (one that is not UTF-8: a model's name,
// a key's, a reason from a program's own source) is the caller's data, not
// a bug of this package: it makes an invalid metric instead, which fails
// that series of the scrape with an error and leaves the others.
func constMetric(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		return prometheus.NewInvalidMetric(d, err)
	}
	return m
}
