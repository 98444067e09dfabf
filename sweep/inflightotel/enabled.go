package inflightotel

import (
	"context"
	"reflect"

	"go.opentelemetry.io/otel"
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
// While the global MeterProvider is still the default one that had no SDK
// behind it at New (unset), a disabled requests counter says that none is
// installed yet: that default's instruments get the SDK's all at once,
// before it becomes the global (only views that drop the counter alone,
// beside a program that put that default back, are told wrong).
func (c *Cap) metered() bool {
	bg := context.Background()
	if c.requests.Enabled(bg) {
		return true
	}
	if c.unset != nil && otel.GetMeterProvider() == c.unset {
		return false
	}
	return c.timeInQueue.Enabled(bg) || c.held.Enabled(bg) || c.misuses.Enabled(bg)
}

// noSDK reports whether m is a meter of OpenTelemetry's default global
// provider made while it had no SDK to delegate to (its type is not
// exported).
func noSDK(m metric.Meter) bool {
	t := reflect.TypeOf(m)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}
