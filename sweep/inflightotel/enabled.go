package inflightotel

import (
	"context"
	"reflect"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// Enabled tells owners, which ask before they build an Event (see
// slots.Observer), whether c wants it: while any of c's instruments is
// enabled (an SDK is installed, and its views keep them), and for an
// admission also when its context carries a recording span. A Cap that
// would record nothing thus costs an admission almost nothing.
func (c *Cap) Enabled(ctx context.Context) bool {
	return c.metered() || ctx != nil && trace.SpanFromContext(ctx).IsRecording()
}

// metered reports whether any instrument Observe records to is enabled.
// A Cap made on the global MeterProvider while it was still the default,
// with no SDK behind it (delegated), asks its requests counter, which the
// SDK's takes over once one is installed, and otherwise what the last
// collection found (see observeCounts): only the SDK's collections tell
// that its views keep the other instruments while dropping that counter,
// and until the first one those instruments go without. Asking the global
// provider each time instead, as it did, took as long again as asking the
// counter (8 ns against 4.5 here), twice an admission (BenchmarkAdmission).
func (c *Cap) metered() bool {
	bg := context.Background()
	if c.requests.Enabled(bg) {
		return true
	}
	if c.delegated {
		return c.others.Load()
	}
	return c.othersEnabled()
}

// othersEnabled reports whether an instrument Observe records to other than
// the requests counter is enabled.
func (c *Cap) othersEnabled() bool {
	bg := context.Background()
	return c.timeInQueue.Enabled(bg) || c.held.Enabled(bg) || c.misuses.Enabled(bg)
}

// noSDK reports whether m is a meter of OpenTelemetry's default global
// provider made while it had no SDK to delegate to (its type is not
// exported).
func noSDK(m metric.Meter) bool {
	t := reflect.TypeOf(m)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}
