package inflightotel_test

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// A Cap wants an Event while an instrument of its is enabled, or, for an
// admission, while its context carries a recording span.
func TestEnabled(t *testing.T) {
	_, tp := tracing(t)
	traced, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	_, tpOff := tracing(t, sdktrace.WithSampler(sdktrace.NeverSample()))
	sampledOut, quiet := tpOff.Tracer("test").Start(context.Background(), "request")
	defer quiet.End()

	global, err := inflightotel.New("provider") // no SDK installed in this process
	require.NoError(t, err)
	assert.False(t, global.Enabled(nil), "a release, no SDK")
	assert.False(t, global.Enabled(context.Background()), "no span")
	assert.False(t, global.Enabled(sampledOut), "a span that does not record")
	assert.True(t, global.Enabled(traced), "a recording span")

	sdk, err := inflightotel.New("provider", inflightotel.WithMeterProvider(newMeters(t)))
	require.NoError(t, err)
	assert.True(t, sdk.Enabled(nil))

	// An SDK whose views drop every instrument of the adapter records
	// nothing, and is asked for nothing.
	dropAll := sdkmetric.NewView(sdkmetric.Instrument{Name: "inflight.*"}, sdkmetric.Stream{Aggregation: sdkmetric.AggregationDrop{}})
	dropped := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()), sdkmetric.WithView(dropAll))
	defer func() { _ = dropped.Shutdown(context.Background()) }()
	off, err := inflightotel.New("provider", inflightotel.WithMeterProvider(dropped))
	require.NoError(t, err)
	assert.False(t, off.Enabled(nil))
	assert.True(t, off.Enabled(traced))
}

// A Cap made on the global MeterProvider before the program installs an
// SDK wants Events once it does, and counts every admission after: run in
// a process of its own, since the global provider cannot be unset.
func TestEnabledOnceTheSDKIsInstalled(t *testing.T) {
	c, admit, child := globalCap(t)
	if !child {
		return
	}
	require.False(t, c.Enabled(nil))
	admit() // not counted: nothing collects yet

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	require.True(t, c.Enabled(nil))
	admit()
	// A test's way to undo it puts the default provider back, which goes
	// on delegating to mp: a Cap made before, or after, still records.
	otel.SetMeterProvider(prev)
	after, err := inflightotel.New("provider")
	require.NoError(t, err)
	require.True(t, c.Enabled(nil))
	require.True(t, after.Enabled(nil))
	admit()

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var acquired int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "inflight.requests" {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					acquired += dp.Value
				}
			}
		}
	}
	assert.Equal(t, int64(2), acquired, "the admissions after the SDK was installed")
}

// A Cap made on the global MeterProvider before the program installs an
// SDK whose views drop inflight.requests and keep the slots' duration
// learns at the SDK's first collection that it is wanted, and records the
// holds after it (its requests counter cannot tell it sooner). In a
// process of its own, as above.
func TestEnabledOnceAViewDropsTheRequestsCounter(t *testing.T) {
	c, admit, child := globalCap(t)
	if !child {
		return
	}
	reader := sdkmetric.NewManualReader()
	dropRequests := sdkmetric.NewView(sdkmetric.Instrument{Name: "inflight.requests"}, sdkmetric.Stream{Aggregation: sdkmetric.AggregationDrop{}})
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithView(dropRequests))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	otel.SetMeterProvider(mp)
	assert.False(t, c.Enabled(nil), "the gap metered documents: before the SDK's first collection")
	admit() // not recorded
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	require.True(t, c.Enabled(nil), "after it")
	admit()
	admit()
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var holds uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			assert.NotEqual(t, "inflight.requests", m.Name, "dropped by the view")
			if m.Name == "inflight.slot.duration" {
				for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
					holds += dp.Count
				}
			}
		}
	}
	assert.Equal(t, uint64(2), holds, "the holds after the first collection")
}

// globalCap runs the calling test again in a process of its own (the
// global provider cannot be unset) and reports false once it passed
// there; in that process it returns a Cap made on the global provider, and
// admit, which admits and releases a slot of a Limiter it observes.
func globalCap(t *testing.T) (c *inflightotel.Cap, admit func(), child bool) {
	t.Helper()
	if os.Getenv("INFLIGHTOTEL_GLOBAL_CHILD") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "INFLIGHTOTEL_GLOBAL_CHILD=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: "+t.Name())
		return nil, nil, false
	}
	c, err := inflightotel.New("provider")
	require.NoError(t, err)
	l := slots.NewLimiter(2, slots.WithObserver(c))
	return c, func() {
		s, err := l.Acquire(context.Background())
		require.NoError(t, err)
		s.Release()
	}, true
}
