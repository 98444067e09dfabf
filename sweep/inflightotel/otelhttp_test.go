package inflightotel_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

// spanNamed returns the ended span called name.
func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if s.Name() == name {
			return s
		}
	}
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	t.Fatalf("no span %q among %q", name, names)
	return nil
}

// spanOfKind returns the one ended span of kind.
func spanOfKind(t *testing.T, spans []sdktrace.ReadOnlySpan, kind trace.SpanKind) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanKind() == kind {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans of kind %v", kind)
	return found[0]
}

// Around the library's Middleware, otelhttp's handler makes the request's
// span; around its Transport, otelhttp's transport makes the client's. In
// both, the wait for the slot is a child of that span, in the same trace.
func TestWithOtelhttp(t *testing.T) {
	sr, tp := tracing(t)
	serverCap, err := inflightotel.New("server")
	require.NoError(t, err)
	server := slots.NewLimiter(2, slots.WithObserver(serverCap))
	admitServer := func(r *http.Request) (*slots.Slot, error) { return server.Acquire(r.Context()) }
	upstream := httptest.NewServer(otelhttp.NewHandler(
		slots.Middleware(admitServer)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "ok")
		})), "upstream", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{})))
	defer upstream.Close()

	clientCap, err := inflightotel.New("client")
	require.NoError(t, err)
	client := slots.NewLimiter(1, slots.WithObserver(clientCap))
	admitClient := func(r *http.Request) (*slots.Slot, error) { return client.Acquire(r.Context()) }
	hc := &http.Client{Transport: otelhttp.NewTransport(slots.NewTransport(nil, admitClient),
		otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}))}

	ctx, root := tp.Tracer("test").Start(context.Background(), "job")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL, nil)
	require.NoError(t, err)
	resp, err := hc.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, "ok", string(body))
	root.End()

	spans := sr.Ended()
	clientSpan := spanOfKind(t, spans, trace.SpanKindClient)
	serverSpan := spanOfKind(t, spans, trace.SpanKindServer)
	clientWait := spanNamed(t, spans, "acquire client")
	serverWait := spanNamed(t, spans, "acquire server")
	assert.Equal(t, clientSpan.SpanContext().SpanID(), clientWait.Parent().SpanID(), "the client's wait, under the client's span")
	assert.Equal(t, serverSpan.SpanContext().SpanID(), serverWait.Parent().SpanID(), "the server's wait, under the server's span")
	for _, s := range []sdktrace.ReadOnlySpan{clientWait, serverWait} {
		assert.Equal(t, root.SpanContext().TraceID(), s.SpanContext().TraceID(), "one trace")
		assert.Equal(t, "acquired", attrMap(s.Attributes())["inflight.result"])
	}
	assert.Equal(t, 0, client.InFlight(), "the client's slot freed with the body")
}
