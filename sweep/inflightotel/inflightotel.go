// Package inflightotel exports a program's caps to OpenTelemetry: their
// counts as metrics, and each admission's wait on the request's trace. It
// uses the OpenTelemetry API only; the SDK and its exporters are the
// program's choice, and until it installs them every call is a no-op.
//
//	tenants, err := inflightotel.New("tenant")
//	if err != nil {
//		return err
//	}
//	reg := registry.New[string](64, slots.WithObserver(tenants))
//	inflightotel.WatchRegistry(tenants, reg)
//
// A Cap is the slots.Observer of one cap (a Limiter, a Registry, a
// pacing.Gate, a fleet Registry through fleet.WithObserver, which reports
// the wait in the store's queue too): every cap's measurements belong to
// the same instruments, told apart by the attribute inflight.cap. It lives
// apart from the core packages, so that a program that does not use
// OpenTelemetry never compiles its API.
//
// # Metrics
//
// Instruments, named by OpenTelemetry's semantic conventions (their
// naming rules: namespaces and UpDownCounters in the singular, counters of
// things in the plural; ASP.NET Core's rate limiting is the nearest
// convention), each with the attribute inflight.cap and no key (keys are
// tenants, models, API keys: too many, and sometimes sensitive):
//
//	inflight.slot.active            updowncounter {slot}    slots held now (a multi-key slot counts per key)
//	inflight.slot.limit             gauge         {slot}    the limit (one-pool caps, when bounded)
//	inflight.slot.duration          histogram     s         how long slots were held
//	inflight.slot.long_held         gauge         {slot}    slots held past a sweep's threshold (see ObserveSweep)
//	inflight.slot.misuses           counter       {call}    by inflight.misuse: double_release, leaked
//	inflight.request.queued         updowncounter {request} callers waiting now
//	inflight.request.time_in_queue  histogram     s         how long each waited for its decision, by inflight.result
//	inflight.requests               counter       {request} admissions decided, by inflight.result
//	inflight.key.active             updowncounter {key}     keys with a holder or a waiter (registries)
//
// inflight.result is acquired, bypassed (fail-open, without a slot),
// limit_reached, queue_full, wait_timeout, canceled, invalid_key,
// exceeds_limit (heavier than the cap can hold), over_budget (a pacing
// budget's refusal) or other;
// the requests and their time in queue also carry inflight.priority
// (interactive, default, batch) when the caller passed a context, and
// inflight.flow only with WithFlowAttribute. The counts by result and the
// histograms come from the Cap's Observe; the others are read from the
// source given to Watch at each collection. The learned caps of a
// pacing.Gate are exported by LearnedCaps. A name, a flow or a refusal's
// text that is not UTF-8 is exported with U+FFFD in place of its bad
// bytes: OTLP refuses such a string, and with it the whole export.
//
// # Traces
//
// An admission made with a context that carries a recording span (otelhttp
// puts one there for each request it handles or sends) adds a child span,
// "acquire <cap>", from the moment the caller asked to its decision, with
// inflight.cap, inflight.priority, inflight.flow (when the caller has one)
// and inflight.result; a refusal sets the span's status to Error. A child
// span rather than an event, because a wait has a duration: the trace then
// shows where the time went, and the wait can be found and measured like
// any other operation. An admission without a recording span records
// nothing and allocates nothing. The span goes to the TracerProvider that
// made the request's span, unless WithTracerProvider names another.
//
// # Cost
//
// Owners ask a Cap whether it wants an Event before they build it (see
// Enabled). Without an SDK and without a recording span it answers no
// after asking one instrument and looking for a span: no allocation, and
// about as much time as an Observer that does nothing but is told every
// Event (BenchmarkAdmission). A request sent over the network does not
// feel it (BenchmarkRoundTrip).
package inflightotel

import (
	"context"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"weak"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
)

// scope is the instrumentation scope of the meters and tracers.
const scope = "github.com/inflight-go/inflight/sweep/inflightotel"

// The attributes' keys.
const (
	AttrCap      = attribute.Key("inflight.cap")
	AttrResult   = attribute.Key("inflight.result")
	AttrPriority = attribute.Key("inflight.priority")
	AttrFlow     = attribute.Key("inflight.flow")
	AttrMisuse   = attribute.Key("inflight.misuse")
)

// An Option configures a Cap or LearnedCaps; a nil one is ignored.
type Option interface{ apply(*config) }

// optionFunc adapts a function to Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	meters  metric.MeterProvider
	tracers trace.TracerProvider // nil: the request's span's own
	flow    bool
}

// WithMeterProvider sets where the metrics go (default: the global
// MeterProvider, otel.GetMeterProvider, at New).
func WithMeterProvider(p metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.meters = p })
}

// WithTracerProvider sets where the waits' spans go (default: the
// provider of the span in the admission's context).
func WithTracerProvider(p trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tracers = p })
}

// WithFlowAttribute puts inflight.flow (slots.WithFlow: a tenant, an org,
// an API key) on the requests counter and the time-in-queue histogram.
// Each flow makes series of its own, and building their attributes costs
// an allocation per admission: use it only where flows are few.
func WithFlowAttribute() Option { return optionFunc(func(c *config) { c.flow = true }) }

func configure(opts []Option) config {
	var c config
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.apply(&c)
	}
	if c.meters == nil {
		c.meters = otel.GetMeterProvider()
	}
	return c
}

// The priorities as inflight.priority says them; noPriority for an
// admission without a context.
const (
	noPriority = 3
	priorities = 4
)

func priorityOf(ctx context.Context) int {
	if ctx == nil {
		return noPriority
	}
	switch slots.PriorityFrom(ctx) {
	case slots.PriorityInteractive:
		return 0
	case slots.PriorityBatch:
		return 2
	}
	return 1
}

var priorityNames = [3]string{"interactive", "default", "batch"}

// Snapshot is what a collection reads from a Cap's source. A negative
// field is not known for the source, and its measurement is left out; a
// Limit of slots.Unlimited is left out too.
type Snapshot struct {
	InFlight int
	Waiting  int
	Keys     int
	Limit    int
}

// Cap is the instruments of one cap: a slots.Observer (pass it to
// slots.WithObserver) and a sweep.Observer. Create it with New; the zero
// value is not usable.
type Cap struct {
	name   string
	cfg    config
	source atomic.Pointer[func() Snapshot]
	over   atomic.Int64 // the last sweep's slots over its threshold; -1: no sweep yet

	requests    metric.Int64Counter
	timeInQueue metric.Float64Histogram
	held        metric.Float64Histogram
	misuses     metric.Int64Counter
	// The attributes of each measurement, made once: a variadic option
	// passed through the API's interfaces would escape, an allocation per
	// measurement.
	byOutcome    [results][priorities]measured
	plain        metric.MeasurementOption // the cap alone
	holds        []metric.RecordOption
	doubles      []metric.AddOption
	leaks        []metric.AddOption
	registration metric.Registration
	tracer       trace.Tracer // nil: the span's provider's
	spanName     string
	// delegated: c's meter came from the global MeterProvider while it had
	// no SDK behind it (see metered); others is what the last collection
	// found of othersEnabled.
	delegated bool
	others    atomic.Bool
}

// measured is the options of an admission's measurements.
type measured struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

func measures(o metric.MeasurementOption) measured {
	return measured{add: []metric.AddOption{o}, record: []metric.RecordOption{o}}
}

var (
	_ slots.Observer = (*Cap)(nil)
	_ sweep.Observer = (*Cap)(nil)
)

// New returns the instruments of the cap capName (for example "tenant",
// "provider", "model:glm-5"), measured with the attribute
// inflight.cap=capName. Caps of different names share the instruments;
// two Caps of one name on one MeterProvider would have their counts added
// together, so give each cap its own.
// Point it at its source with WatchLimiter, WatchRegistry or Watch for the
// counts of slots, waiters, keys and the limit. It fails if the meter
// refuses an instrument.
func New(capName string, opts ...Option) (*Cap, error) {
	capName = utf8Only(capName)
	c := &Cap{name: capName, cfg: configure(opts), spanName: "acquire " + capName}
	c.over.Store(-1)
	if c.cfg.tracers != nil {
		c.tracer = c.cfg.tracers.Tracer(scope)
	}
	m := c.cfg.meters.Meter(scope)
	c.delegated = noSDK(m)
	var err error
	c.requests, err = m.Int64Counter("inflight.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Admissions decided, by result."))
	if err != nil {
		return nil, err
	}
	c.timeInQueue, err = m.Float64Histogram("inflight.request.time_in_queue", metric.WithUnit("s"),
		metric.WithDescription("How long each admission waited for its decision, by result."),
		metric.WithExplicitBucketBoundaries(0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	if err != nil {
		return nil, err
	}
	c.held, err = m.Float64Histogram("inflight.slot.duration", metric.WithUnit("s"),
		metric.WithDescription("How long slots were held."),
		metric.WithExplicitBucketBoundaries(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800))
	if err != nil {
		return nil, err
	}
	c.misuses, err = m.Int64Counter("inflight.slot.misuses", metric.WithUnit("{call}"),
		metric.WithDescription("Release calls on a slot already released, and slots reclaimed after they were dropped unreleased."))
	if err != nil {
		return nil, err
	}
	cp := AttrCap.String(capName)
	c.plain = metric.WithAttributeSet(attribute.NewSet(cp))
	c.holds = []metric.RecordOption{c.plain}
	c.doubles = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(cp, AttrMisuse.String("double_release")))}
	c.leaks = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(cp, AttrMisuse.String("leaked")))}
	for r := range results {
		for p := range priorities {
			kv := []attribute.KeyValue{cp, AttrResult.String(resultNames[r])}
			if p != noPriority {
				kv = append(kv, AttrPriority.String(priorityNames[p]))
			}
			c.byOutcome[r][p] = measures(metric.WithAttributeSet(attribute.NewSet(kv...)))
		}
	}
	if err := c.observeCounts(m); err != nil {
		return nil, err
	}
	return c, nil
}

// observeCounts registers the instruments read from the source at each
// collection.
func (c *Cap) observeCounts(m metric.Meter) error {
	active, err := m.Int64ObservableUpDownCounter("inflight.slot.active", metric.WithUnit("{slot}"),
		metric.WithDescription("Units held now (one per slot unless weighted); a slot held under several keys counts under each."))
	if err != nil {
		return err
	}
	queued, err := m.Int64ObservableUpDownCounter("inflight.request.queued", metric.WithUnit("{request}"),
		metric.WithDescription("Callers waiting for a slot now."))
	if err != nil {
		return err
	}
	keys, err := m.Int64ObservableUpDownCounter("inflight.key.active", metric.WithUnit("{key}"),
		metric.WithDescription("Keys with a holder or a waiter now."))
	if err != nil {
		return err
	}
	limit, err := m.Int64ObservableGauge("inflight.slot.limit", metric.WithUnit("{slot}"),
		metric.WithDescription("The limit, while bounded."))
	if err != nil {
		return err
	}
	longHeld, err := m.Int64ObservableGauge("inflight.slot.long_held", metric.WithUnit("{slot}"),
		metric.WithDescription("Slots held past the threshold at the last sweep."))
	if err != nil {
		return err
	}
	c.registration, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c.others.Store(c.othersEnabled())
		if n := c.over.Load(); n >= 0 {
			o.ObserveInt64(longHeld, n, c.plain)
		}
		f := c.source.Load()
		if f == nil {
			return nil // not watching anything yet
		}
		s := (*f)()
		for _, m := range []struct {
			i metric.Int64Observable
			v int
		}{{active, s.InFlight}, {queued, s.Waiting}, {keys, s.Keys}} {
			if m.v >= 0 {
				o.ObserveInt64(m.i, int64(m.v), c.plain)
			}
		}
		if s.Limit >= 0 && s.Limit != slots.Unlimited {
			o.ObserveInt64(limit, int64(s.Limit), c.plain)
		}
		return nil
	}, active, queued, keys, limit, longHeld)
	return err
}

// Close stops the Cap's gauges, read at collections (its source's counts
// and the long-held slots), and lets its source go; its counters and
// histograms stay (a program that drops a cap drops its Cap too).
func (c *Cap) Close() error {
	c.source.Store(nil)
	return c.registration.Unregister()
}

// Watch makes c report what f returns at each collection. f is called from
// the collecting goroutine and may run concurrently with itself. A nil f
// stops watching: c then reports no source's counts, as before its first
// Watch.
func Watch(c *Cap, f func() Snapshot) {
	if f == nil {
		c.source.Store(nil)
		return
	}
	c.source.Store(&f)
}

// WatchLimiter makes c report l's counts while l is in use: c does not
// keep l alive (nor a sweep.Monitor of l that c observes for running),
// and reports nothing of it once it is gone.
func WatchLimiter(c *Cap, l *slots.Limiter) {
	watchWeakly(c, l, func(l *slots.Limiter) Snapshot {
		st := l.Stats()
		return Snapshot{InFlight: st.InFlight, Waiting: st.Waiting, Keys: -1, Limit: st.Limit}
	})
}

// WatchRegistry makes c report r's counts, as WatchLimiter does a
// Limiter's. A registry's limits are per key, so it has no limit.
func WatchRegistry[K comparable](c *Cap, r *registry.Registry[K]) {
	watchWeakly(c, r, func(r *registry.Registry[K]) Snapshot {
		st := r.Stats()
		return Snapshot{InFlight: st.InFlight, Waiting: st.Waiting, Keys: st.Keys, Limit: -1}
	})
}

// watchWeakly makes c report read(v) while v is in use, and nothing once
// it is gone.
func watchWeakly[T any](c *Cap, v *T, read func(*T) Snapshot) {
	wp := weak.Make(v)
	Watch(c, func() Snapshot {
		if v := wp.Value(); v != nil {
			return read(v)
		}
		return Snapshot{InFlight: -1, Waiting: -1, Keys: -1, Limit: -1}
	})
}

// ObserveSweep implements sweep.Observer: pass the Cap to the Monitor of
// its source (sweep.WithObserver), and inflight.slot.long_held reports
// the slots over the Monitor's threshold, until the Monitor ends.
func (c *Cap) ObserveSweep(t sweep.Tick) {
	if t.Stopped {
		c.over.Store(-1) // no figure is better than a stale one
		return
	}
	c.over.Store(int64(t.OverThreshold))
}

// Observe implements slots.Observer: it counts each admission by result,
// records its time in queue and each hold, and puts the admission on its
// context's span when one is recording.
//
// Without an SDK (or with its instruments disabled by a view) it only
// asks whether they are enabled, and without a recording span it only
// looks for one: it stays off an admission's way.
func (c *Cap) Observe(e slots.Event) {
	bg := context.Background()
	switch e.Kind {
	case slots.EventAcquired, slots.EventBypassed, slots.EventRejected:
		r := resultOf(e)
		if c.requests.Enabled(bg) || c.timeInQueue.Enabled(bg) {
			m := c.byOutcome[r][priorityOf(e.Context)]
			if c.cfg.flow && e.Context != nil {
				if flow, _ := slots.FlowFrom(e.Context); flow != "" {
					m = measures(c.withFlow(r, e.Context, flow))
				}
			}
			c.requests.Add(bg, 1, m.add...)
			c.timeInQueue.Record(bg, seconds(e.Wait), m.record...)
		}
		if e.Context != nil {
			c.trace(e, r)
		}
	case slots.EventReleased:
		if c.held.Enabled(bg) {
			c.held.Record(bg, seconds(e.Hold), c.holds...)
		}
	case slots.EventDoubleRelease:
		c.misuses.Add(context.Background(), 1, c.doubles...)
	case slots.EventLeaked:
		c.misuses.Add(context.Background(), 1, c.leaks...)
	}
}

// seconds is d in seconds: one multiplication (Duration.Seconds divides
// twice, a fifth of Observe's time), exact to the nanosecond for any wait
// or hold under 100 days.
func seconds(d time.Duration) float64 { return float64(d) * 1e-9 }

// withFlow is the attributes of an admission of result r under ctx with
// its flow.
func (c *Cap) withFlow(r int, ctx context.Context, flow string) metric.MeasurementOption {
	return metric.WithAttributes(AttrCap.String(c.name), AttrResult.String(resultNames[r]),
		AttrPriority.String(priorityNames[priorityOf(ctx)]), AttrFlow.String(utf8Only(flow)))
}

// utf8Only is s with each run of bytes that are not UTF-8 replaced by
// U+FFFD: OTLP's protobuf refuses a string that is not UTF-8, and with it
// every span or point exported in the same request.
func utf8Only(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// trace adds the admission e, of result r, to the span of its context as
// a child span, if that span is recording.
func (c *Cap) trace(e slots.Event, r int) {
	parent := trace.SpanFromContext(e.Context)
	if !parent.IsRecording() {
		return
	}
	tracer := c.tracer
	if tracer == nil {
		tracer = parent.TracerProvider().Tracer(scope)
	}
	end := time.Now()
	flow, _ := slots.FlowFrom(e.Context)
	attrs := []attribute.KeyValue{
		AttrCap.String(c.name),
		AttrPriority.String(priorityNames[priorityOf(e.Context)]),
		AttrResult.String(resultNames[r]),
	}
	if flow != "" {
		attrs = append(attrs, AttrFlow.String(utf8Only(flow)))
	}
	_, span := tracer.Start(e.Context, c.spanName, trace.WithTimestamp(end.Add(-e.Wait)),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	if e.Kind == slots.EventRejected {
		span.SetStatus(codes.Error, statusOf(e.Err, r))
	}
	span.End(trace.WithTimestamp(end))
}
