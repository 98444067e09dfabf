package inflightotel_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// meters is a MeterProvider whose measurements the test collects.
type meters struct {
	*sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

func newMeters(t *testing.T) meters {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return meters{mp, r}
}

// collect returns the instruments collected now, by name.
func (m meters) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, "github.com/inflight-go/inflight/sweep/inflightotel", sm.Scope.Name)
		for _, im := range sm.Metrics {
			out[im.Name] = im.Data
		}
	}
	return out
}

// attrs renders a set as "k=v,k=v", in the set's order (sorted by key).
func attrs(s attribute.Set) string {
	out := ""
	for _, kv := range s.ToSlice() {
		if out != "" {
			out += ","
		}
		out += string(kv.Key) + "=" + kv.Value.String()
	}
	return out
}

// ints returns an int64 sum's or gauge's points by attributes.
func ints(t *testing.T, a metricdata.Aggregation) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	switch d := a.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out[attrs(p.Attributes)] = p.Value
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out[attrs(p.Attributes)] = p.Value
		}
	default:
		t.Fatalf("not an int64 sum or gauge: %T", a)
	}
	return out
}

// counts returns a histogram's counts and sums by attributes.
func counts(t *testing.T, a metricdata.Aggregation) (map[string]uint64, map[string]float64) {
	t.Helper()
	h, ok := a.(metricdata.Histogram[float64])
	require.True(t, ok, "not a float64 histogram: %T", a)
	n, sum := map[string]uint64{}, map[string]float64{}
	for _, p := range h.DataPoints {
		n[attrs(p.Attributes)], sum[attrs(p.Attributes)] = p.Count, p.Sum
	}
	return n, sum
}

// A Limiter's every outcome is counted by result and priority, its waits
// and holds measured, its misuse counted, and its counts read at each
// collection; nothing names a key.
func TestLimiterMetrics(t *testing.T) {
	m := newMeters(t)
	c, err := inflightotel.New("provider", inflightotel.WithMeterProvider(m))
	require.NoError(t, err)
	mock := testrig.NewSettingClock()
	l := slots.NewLimiter(1, slots.WithClock(mock), slots.WithObserver(c), slots.WithMaxQueue(1), slots.WithMaxWait(2*time.Second))
	inflightotel.WatchLimiter(c, l)

	held, err := l.TryAcquire()
	require.NoError(t, err)
	_, err = l.TryAcquire()
	require.ErrorIs(t, err, slots.ErrLimitReached)
	batch := slots.WithPriority(context.Background(), slots.PriorityBatch)
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(batch)
		errc <- err
	}()
	for l.Waiting() == 0 {
		runtime.Gosched()
	}
	_, err = l.Acquire(context.Background())
	require.ErrorIs(t, err, slots.ErrQueueFull)

	got := m.collect(t)
	assert.Equal(t, map[string]int64{"inflight.cap=provider": 1}, ints(t, got["inflight.slot.active"]))
	assert.Equal(t, map[string]int64{"inflight.cap=provider": 1}, ints(t, got["inflight.request.queued"]))
	assert.Equal(t, map[string]int64{"inflight.cap=provider": 1}, ints(t, got["inflight.slot.limit"]))
	assert.NotContains(t, got, "inflight.key.active", "a Limiter has no keys")
	assert.NotContains(t, got, "inflight.slot.long_held", "no sweep yet")

	// The clock moves once, when the waiter's timer is set (SettingClock).
	mock.WaitSet(t, 1, 2*time.Second)
	mock.Add(2 * time.Second)
	require.ErrorIs(t, <-errc, slots.ErrWaitTimeout)
	mock.Add(time.Second)
	held.Release()
	held.Release()

	got = m.collect(t)
	assert.Equal(t, map[string]int64{
		"inflight.cap=provider,inflight.result=acquired":                             1,
		"inflight.cap=provider,inflight.result=limit_reached":                        1,
		"inflight.cap=provider,inflight.priority=default,inflight.result=queue_full": 1,
		"inflight.cap=provider,inflight.priority=batch,inflight.result=wait_timeout": 1,
	}, ints(t, got["inflight.requests"]))
	n, sum := counts(t, got["inflight.request.time_in_queue"])
	assert.Equal(t, uint64(1), n["inflight.cap=provider,inflight.priority=batch,inflight.result=wait_timeout"])
	assert.InDelta(t, 2.0, sum["inflight.cap=provider,inflight.priority=batch,inflight.result=wait_timeout"], 0.11, "waited out its 2 s")
	assert.Equal(t, 0.0, sum["inflight.cap=provider,inflight.result=acquired"], "TryAcquire waits for nothing")
	n, sum = counts(t, got["inflight.slot.duration"])
	assert.Equal(t, map[string]uint64{"inflight.cap=provider": 1}, n)
	assert.InDelta(t, 3.0, sum["inflight.cap=provider"], 0.11, "held while the waiter timed out, and a second more")
	assert.Equal(t, map[string]int64{"inflight.cap=provider,inflight.misuse=double_release": 1}, ints(t, got["inflight.slot.misuses"]))
	assert.Equal(t, map[string]int64{"inflight.cap=provider": 0}, ints(t, got["inflight.slot.active"]))
}

// A Registry's keys are counted (never named), an invalid key is a result
// of its own, a sweep's long-held slots are reported, and with
// WithFlowAttribute the flow is an attribute of the requests.
func TestRegistryMetrics(t *testing.T) {
	m := newMeters(t)
	c, err := inflightotel.New("tenant", inflightotel.WithMeterProvider(m), inflightotel.WithFlowAttribute())
	require.NoError(t, err)
	reg := registry.New[string](2, slots.WithObserver(c), registry.WithMaxKeyBytes(8))
	inflightotel.WatchRegistry(c, reg)
	a, err := reg.Acquire(slots.WithFlow(context.Background(), "org-a"), "org-a")
	require.NoError(t, err)
	b, err := reg.TryAcquire("org-b")
	require.NoError(t, err)
	d, err := reg.Acquire(context.Background(), "org-d") // no flow: no empty inflight.flow
	require.NoError(t, err)
	d.Release()
	_, err = reg.TryAcquire("much too long")
	require.ErrorIs(t, err, registry.ErrInvalidKey)
	c.ObserveSweep(sweep.Tick{InUse: 2, Keys: 2, MaxPerKey: 1, OverThreshold: 1, NewlyOver: 1})

	got := m.collect(t)
	assert.Equal(t, map[string]int64{"inflight.cap=tenant": 2}, ints(t, got["inflight.key.active"]))
	assert.Equal(t, map[string]int64{"inflight.cap=tenant": 2}, ints(t, got["inflight.slot.active"]))
	assert.NotContains(t, got, "inflight.slot.limit", "a registry's limits are per key")
	assert.Equal(t, map[string]int64{"inflight.cap=tenant": 1}, ints(t, got["inflight.slot.long_held"]))
	assert.Equal(t, map[string]int64{
		"inflight.cap=tenant,inflight.flow=org-a,inflight.priority=default,inflight.result=acquired": 1,
		"inflight.cap=tenant,inflight.priority=default,inflight.result=acquired":                     1,
		"inflight.cap=tenant,inflight.result=acquired":                                               1,
		"inflight.cap=tenant,inflight.result=invalid_key":                                            1,
	}, ints(t, got["inflight.requests"]))
	c.ObserveSweep(sweep.Tick{Stopped: true}) // its Monitor ended
	assert.NotContains(t, m.collect(t), "inflight.slot.long_held", "no stale figure once the Monitor has ended")
	a.Release()
	b.Release()
	require.NoError(t, c.Close())
	got = m.collect(t)
	assert.NotContains(t, got, "inflight.slot.active", "no longer read after Close")
}

// tracing is a TracerProvider that records every span, and a parent span
// of a request, as otelhttp makes one.
func tracing(t *testing.T, opts ...sdktrace.TracerProviderOption) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithSpanProcessor(sr))...)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return sr, tp
}

func attrMap(kvs []attribute.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// An admission under a recording span adds a child span from the call to
// the decision, with the cap, class, flow and result; a refusal is an
// error. Without a span, or with one not recording, nothing is added.
func TestWaitOnTheTrace(t *testing.T) {
	sr, tp := tracing(t)
	c, err := inflightotel.New("provider")
	require.NoError(t, err)
	l := slots.NewLimiter(1, slots.WithObserver(c), slots.WithMaxWait(50*time.Millisecond))

	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	ctx = slots.WithFlow(slots.WithPriority(ctx, slots.PriorityInteractive), "org-a")
	s, err := l.Acquire(ctx)
	require.NoError(t, err)
	_, err = l.Acquire(ctx) // waits its 50 ms, and is turned away
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	_, err = l.Acquire(context.Background()) // no span: nothing recorded
	require.Error(t, err)
	s.Release()
	parent.End()

	spans := sr.Ended()
	require.Len(t, spans, 3, "two admissions and the request")
	for _, sp := range spans[:2] {
		assert.Equal(t, "acquire provider", sp.Name())
		assert.Equal(t, trace.SpanKindInternal, sp.SpanKind())
		assert.Equal(t, parent.SpanContext().SpanID(), sp.Parent().SpanID(), "a child of the request's span")
		assert.Equal(t, parent.SpanContext().TraceID(), sp.SpanContext().TraceID())
	}
	admitted, refused := spans[0], spans[1]
	assert.Equal(t, map[string]string{"inflight.cap": "provider", "inflight.priority": "interactive",
		"inflight.flow": "org-a", "inflight.result": "acquired"}, attrMap(admitted.Attributes()))
	assert.Equal(t, codes.Unset, admitted.Status().Code)
	assert.Equal(t, "wait_timeout", attrMap(refused.Attributes())["inflight.result"])
	assert.Equal(t, codes.Error, refused.Status().Code)
	assert.Contains(t, refused.Status().Description, slots.ErrWaitTimeout.Error())
	assert.GreaterOrEqual(t, refused.EndTime().Sub(refused.StartTime()), 50*time.Millisecond, "the span covers the wait")

	// A span that does not record (sampled out) gets no child.
	sr2, tp2 := tracing(t, sdktrace.WithSampler(sdktrace.NeverSample()))
	ctx, quiet := tp2.Tracer("test").Start(context.Background(), "request")
	require.False(t, quiet.IsRecording())
	s, err = l.Acquire(ctx)
	require.NoError(t, err)
	s.Release()
	quiet.End()
	assert.Empty(t, sr2.Ended())
}

// WithTracerProvider sends the waits' spans to its provider, whatever
// made the request's span.
func TestWithTracerProvider(t *testing.T) {
	_, tp := tracing(t)
	own, ownTP := tracing(t)
	c, err := inflightotel.New("model:x", inflightotel.WithTracerProvider(ownTP))
	require.NoError(t, err)
	reg := registry.New[string](1, slots.WithObserver(c))
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	s, err := reg.AcquireAll(ctx, "model:x", "provider")
	require.NoError(t, err)
	s.Release()
	parent.End()
	require.Len(t, own.Ended(), 1)
	assert.Equal(t, "acquire model:x", own.Ended()[0].Name())
	assert.Equal(t, parent.SpanContext().SpanID(), own.Ended()[0].Parent().SpanID())
}

// With no span in the context and no MeterProvider installed, observing
// admissions allocates nothing beyond what an admission allocates anyway.
func TestNoAllocationWithoutSpanOrSDK(t *testing.T) {
	c, err := inflightotel.New("provider")
	require.NoError(t, err)
	bare := slots.NewLimiter(8)
	observed := slots.NewLimiter(8, slots.WithObserver(c))
	ctx := slots.WithPriority(context.Background(), slots.PriorityBatch)
	run := func(l *slots.Limiter) float64 {
		return testing.AllocsPerRun(1000, func() {
			s, err := l.Acquire(ctx)
			if err != nil {
				panic(err)
			}
			s.Release()
		})
	}
	assert.Equal(t, run(bare), run(observed))
}

// A wait's span starts within its request's span, granted or timed out,
// on a Limiter and a Registry: their waits are timed on exact readings (a
// coarse start, up to a tick early, put most of them before their parent).
func TestWaitSpansStartWithinTheirRequest(t *testing.T) {
	sr, tp := tracing(t)
	c, err := inflightotel.New("tenant")
	require.NoError(t, err)
	lim := slots.NewLimiter(1, slots.WithObserver(c), slots.WithMaxWait(time.Millisecond))
	reg := registry.New[string](1, slots.WithObserver(c), slots.WithMaxWait(time.Millisecond))
	granted := 0
	for _, acquire := range []func(context.Context) (*slots.Slot, error){
		lim.Acquire,
		func(ctx context.Context) (*slots.Slot, error) { return reg.Acquire(ctx, "org") },
	} {
		for range 20 {
			held, err := acquire(context.Background())
			require.NoError(t, err)
			ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
			_, err = acquire(ctx) // waits a millisecond, and is turned away
			require.ErrorIs(t, err, slots.ErrWaitTimeout)

			got := make(chan error, 1)
			go func() {
				s, err := acquire(ctx)
				if err == nil {
					s.Release()
				}
				got <- err
			}()
			held.Release()
			err = <-got
			parent.End()
			if errors.Is(err, slots.ErrWaitTimeout) {
				continue // the release came after the wait's millisecond (a busy machine): turned away too
			}
			require.NoError(t, err)
			granted++
		}
	}
	require.Positive(t, granted, "waits granted")
	byParent := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, sp := range sr.Ended() {
		if sp.Name() == "request" {
			byParent[sp.SpanContext().SpanID()] = sp
		}
	}
	early := 0
	for _, sp := range sr.Ended() {
		if p, ok := byParent[sp.Parent().SpanID()]; ok && sp.StartTime().Before(p.StartTime()) {
			early++
			t.Logf("%s (%s) started %v before its request", sp.Name(), attrMap(sp.Attributes())["inflight.result"], p.StartTime().Sub(sp.StartTime()))
		}
	}
	assert.Zero(t, early, "waits' spans that start before their request's")
}

// A refusal's span is described by its reason, never by an error's text
// that names the key refused (a fleet Registry reports its whole
// *slots.LimitError): the key refused (a tenant, an API key) is not put
// on traces. (A flow is, as inflight.flow: the caller chose to name it
// with slots.WithFlow.)
func TestRefusalSpanNamesNoKey(t *testing.T) {
	sr, tp := tracing(t)
	c, err := inflightotel.New("tenant")
	require.NoError(t, err)
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	refusal := &slots.LimitError{Err: slots.ErrLimitReached, Key: "org-secret/glm-5", InFlight: 2, Limit: 2}
	c.Observe(slots.Event{Kind: slots.EventRejected, Err: refusal, Context: ctx})
	c.Observe(slots.Event{Kind: slots.EventRejected, Err: fmt.Errorf("store down for org-secret: %w", context.DeadlineExceeded), Context: ctx})
	parent.End()
	var got []string
	for _, sp := range sr.Ended() {
		if sp.Name() == "acquire tenant" {
			assert.Equal(t, codes.Error, sp.Status().Code)
			got = append(got, sp.Status().Description)
		}
	}
	require.Len(t, got, 2)
	assert.Equal(t, slots.ErrLimitReached.Error(), got[0])
	assert.NotContains(t, got[0], "org-secret")
	assert.Equal(t, context.DeadlineExceeded.Error(), got[1], "a context's end: the context's error")
}
