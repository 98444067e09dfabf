package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// TelemetryConfig sends the gateway's traces and metrics to an
// OpenTelemetry collector over OTLP (HTTP, protobuf), beside /metrics: a
// span for each request served (and one for each sent upstream), the wait
// for the provider's caps as a child span "acquire <cap>" with its result,
// and the caps' and learned caps' metrics of package inflightotel.
type TelemetryConfig struct {
	// OTLPEndpoint is the collector's base URL, as
	// "http://127.0.0.1:4318": traces go to /v1/traces under it, metrics
	// to /v1/metrics.
	OTLPEndpoint string `json:"otlp_endpoint"`
	// ServiceName names the gateway in the telemetry (default
	// "inflight-gateway").
	ServiceName string `json:"service_name,omitempty"`
	// MetricsIntervalMS is how often metrics are sent (default 60000).
	MetricsIntervalMS int64 `json:"metrics_interval_ms,omitempty"`
}

// check reports what is wrong with t, naming the field.
func (t TelemetryConfig) check() error {
	u, err := url.Parse(t.OTLPEndpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("telemetry.otlp_endpoint: %q is not an http or https URL", redactURL(t.OTLPEndpoint))
	}
	if t.MetricsIntervalMS < 0 || t.MetricsIntervalMS > 3_600_000 {
		return fmt.Errorf("telemetry.metrics_interval_ms: %d is not between 0 and 3600000", t.MetricsIntervalMS)
	}
	return nil
}

// telemetry is the gateway's OpenTelemetry: the providers its spans and
// metrics go to, and the instruments of the caps it exports there.
type telemetry struct {
	traces   trace.TracerProvider
	meters   metric.MeterProvider
	shutdown []func(context.Context) error // the SDK's, when the gateway made it
	tenants  *inflightotel.Cap
	provider *inflightotel.Cap // the wait for the provider's caps, fleet and Gate together
	learned  *inflightotel.LearnedCaps
}

// WithTelemetry sends the gateway's telemetry to the given providers (for
// example an SDK with an in-memory exporter), in place of the OTLP ones
// the config's telemetry section makes.
func WithTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) Option {
	return func(g *Gateway) { g.tel = &telemetry{traces: tp, meters: mp} }
}

// startTelemetry makes the OTLP exporters of cfg.Telemetry, unless
// WithTelemetry gave providers, and the caps' instruments. Without either
// it does nothing.
func (g *Gateway) startTelemetry(cfg Config) error {
	if g.tel == nil {
		t := cfg.Telemetry
		if t == nil {
			return nil
		}
		tel, err := otlpProviders(*t)
		if err != nil {
			return err
		}
		g.tel = tel
	}
	opts := []inflightotel.Option{inflightotel.WithMeterProvider(g.tel.meters), inflightotel.WithTracerProvider(g.tel.traces)}
	var err error
	if g.tel.tenants, err = inflightotel.New("tenant", opts...); err != nil {
		return err
	}
	g.tel.provider, err = inflightotel.New("provider", opts...)
	return err
}

// otlpProviders makes SDK providers that export over OTLP to t's endpoint.
func otlpProviders(t TelemetryConfig) (*telemetry, error) {
	name := t.ServiceName
	if name == "" {
		name = "inflight-gateway"
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name))
	base := t.OTLPEndpoint
	for len(base) > 0 && base[len(base)-1] == '/' {
		base = base[:len(base)-1]
	}
	// New connects lazily: nothing here waits for the collector.
	spans, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(base+"/v1/traces"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: traces: %w", err)
	}
	points, err := otlpmetrichttp.New(context.Background(), otlpmetrichttp.WithEndpointURL(base+"/v1/metrics"))
	if err != nil {
		return nil, fmt.Errorf("telemetry: metrics: %w", err)
	}
	interval := time.Minute
	if t.MetricsIntervalMS > 0 {
		interval = millis(t.MetricsIntervalMS)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans), sdktrace.WithResource(res))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(points, sdkmetric.WithInterval(interval))),
		sdkmetric.WithResource(res))
	return &telemetry{traces: tp, meters: mp, shutdown: []func(context.Context) error{tp.Shutdown, mp.Shutdown}}, nil
}

// propagators carry a trace from a client through the gateway to the
// upstream: W3C trace context and baggage.
var propagators = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// tracedHandler puts each request served on a span of its own, when the
// gateway has telemetry.
func (g *Gateway) tracedHandler(h http.Handler) http.Handler {
	if g.tel == nil {
		return h
	}
	return otelhttp.NewHandler(h, "gateway", otelhttp.WithTracerProvider(g.tel.traces),
		otelhttp.WithMeterProvider(g.tel.meters), otelhttp.WithPropagators(propagators))
}

// tracedTransport puts each exchange with the upstream on a span of its
// own, under the request's, when the gateway has telemetry. It is the
// provider Transport's base: the span starts once the request is admitted.
func (g *Gateway) tracedTransport(base http.RoundTripper) http.RoundTripper {
	if g.tel == nil {
		return base
	}
	return otelhttp.NewTransport(base, otelhttp.WithTracerProvider(g.tel.traces),
		otelhttp.WithMeterProvider(g.tel.meters), otelhttp.WithPropagators(propagators))
}

// watchTelemetry reads the caps' counts for the telemetry's collections:
// the tenants' registry, the provider's counts as /metrics has them, and
// the learned caps.
func (g *Gateway) watchTelemetry() error {
	if g.tel == nil {
		return nil
	}
	inflightotel.WatchRegistry(g.tel.tenants, g.tenants)
	inflightotel.Watch(g.tel.provider, func() inflightotel.Snapshot {
		s, _ := g.prom.Snapshot("provider")
		return inflightotel.Snapshot{InFlight: s.InFlight, Waiting: s.Waiting, Keys: -1, Limit: s.Limit}
	})
	var err error
	g.tel.learned, err = inflightotel.NewLearnedCaps("provider", g, inflightotel.WithMeterProvider(g.tel.meters))
	return err
}

// WithSweep adds options to the Monitor of the tenants' holders (sweep.New):
// how often it sweeps and past what a slot is held long (defaults 60 s and
// 30 min); for tests.
func WithSweep(opts ...sweep.Option) Option {
	return func(g *Gateway) { g.sweepOpts = append(g.sweepOpts, opts...) }
}

// sweepOptions are the Monitor's: its log, WithSweep's, and with telemetry
// the OpenTelemetry adapter, which exports the slots it finds held long
// (inflight.slot.long_held).
func (g *Gateway) sweepOptions() []sweep.Option {
	opts := append([]sweep.Option{sweep.WithLogger(g.log)}, g.sweepOpts...)
	if g.tel != nil {
		opts = append(opts, sweep.WithObserver(g.tel.tenants))
	}
	return opts
}

// tenantObserver is what the tenants' registry reports to: the Prometheus
// collector, and with telemetry its instruments too.
func (g *Gateway) tenantObserver(prom slots.Observer) slots.Observer {
	if g.tel == nil {
		return prom
	}
	return slots.ObserverFunc(func(e slots.Event) {
		prom.Observe(e)
		if e.Kind == slots.EventRejected && e.Context == nil {
			return // the gateway's TryAcquire: told with its request's context (rejectTenant)
		}
		g.tel.tenants.Observe(e)
	})
}

// close flushes and stops what the gateway made, within ctx.
func (t *telemetry) close(ctx context.Context) error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.learned != nil {
		errs = append(errs, t.learned.Close())
	}
	for _, c := range []*inflightotel.Cap{t.tenants, t.provider} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}
