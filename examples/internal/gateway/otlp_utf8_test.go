package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// A Cap puts an admission's flow on its span as inflight.flow. A flow that
// is not UTF-8 (a tenant named by a client's header, say) must not cost
// the spans exported beside it: OTLP's protobuf refuses a string that is
// not UTF-8, and with it the whole batch.
func TestOTLPExportOfAFlowNotUTF8(t *testing.T) {
	var posts atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		posts.Add(1)
	}))
	defer collector.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(collector.URL+"/v1/traces"))
	require.NoError(t, err)
	defer func() { _ = exp.Shutdown(context.Background()) }()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c, err := inflightotel.New("tenant", inflightotel.WithMeterProvider(metricnoop.NewMeterProvider()))
	require.NoError(t, err)
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	c.Observe(slots.Event{Kind: slots.EventAcquired, Context: slots.WithFlow(ctx, "org-\xff")})
	span.End()
	spans := sr.Ended()
	require.Len(t, spans, 2, "the request's span and its wait's")

	assert.NoError(t, exp.ExportSpans(context.Background(), spans), "the request's span and its wait's exported")
	assert.Equal(t, int64(1), posts.Load())
}
