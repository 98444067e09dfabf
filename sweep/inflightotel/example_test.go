package inflightotel_test

import (
	"context"
	"fmt"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightotel"
)

func ExampleNew() {
	// A program installs its SDK (here one that keeps spans in memory);
	// otelhttp's handler or transport would start the request's span.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	tenants, err := inflightotel.New("tenant") // the metrics go to otel.GetMeterProvider()
	if err != nil {
		panic(err)
	}
	reg := registry.New[string](64, slots.WithObserver(tenants))
	inflightotel.WatchRegistry(tenants, reg)

	ctx, request := tp.Tracer("gateway").Start(context.Background(), "POST /v1/chat/completions")
	s, err := reg.Acquire(slots.WithPriority(ctx, slots.PriorityInteractive), "org-a")
	if err != nil {
		panic(err)
	}
	s.Release()
	request.End()

	wait := spans.Ended()[0]
	fmt.Println(wait.Name(), "under", spans.Ended()[1].Name())
	for _, kv := range wait.Attributes() {
		fmt.Printf("  %s=%s\n", kv.Key, kv.Value.String())
	}
	// Output:
	// acquire tenant under POST /v1/chat/completions
	//   inflight.cap=tenant
	//   inflight.priority=interactive
	//   inflight.result=acquired
}
