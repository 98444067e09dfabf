package gateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
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
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/sweep"
)

func attrsOf(kvs []attribute.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// One request admitted and one turned away after its wait, through the
// gateway with telemetry, its spans exported by the SDK's in-memory
// exporter: each request's span has the wait for the
// provider's caps as a child span with its result (the refused one an
// error, as long as its wait), the upstream exchange is a client span
// under the admitted request's, the caps' metrics count both, and the
// access log line says what each waited and held or what refused it.
func TestGatewayTelemetry(t *testing.T) {
	spans, reader, tel, logs := newTelemetry(t)

	u := newUpstream(t)
	srv, _ := startGatewayWith(t, u.srv.URL, `{
		"upstream": "%s",
		"provider": {"max_concurrent_requests": 1, "max_queue_wait_ms": 300}
	}`, tel...)

	held, err := post(context.Background(), t, srv.Client(), srv.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	first := make([]byte, 8)
	_, err = io.ReadFull(held.Body, first) // the stream has started: the slot is held
	require.NoError(t, err)
	refused, err := post(context.Background(), t, srv.Client(), srv.URL, "org-b", "glm-5.3")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, refused.Body)
	require.NoError(t, refused.Body.Close())
	assert.Equal(t, http.StatusTooManyRequests, refused.StatusCode)
	assertRetryAfter(t, refused.Header)
	close(u.gate)
	_, _ = io.Copy(io.Discard, held.Body)
	require.NoError(t, held.Body.Close())
	waitFor(t, "both requests' spans ended", func() bool {
		n := 0
		for _, s := range spans.GetSpans() {
			if s.SpanKind == trace.SpanKindServer {
				n++
			}
		}
		return n == 2
	})

	byParent := map[trace.SpanID][]tracetest.SpanStub{}
	var servers []tracetest.SpanStub
	for _, s := range spans.GetSpans() {
		byParent[s.Parent.SpanID()] = append(byParent[s.Parent.SpanID()], s)
		if s.SpanKind == trace.SpanKindServer {
			servers = append(servers, s)
		}
	}
	results := map[string]tracetest.SpanStub{}
	for _, server := range servers {
		var wait, client *tracetest.SpanStub
		for _, c := range byParent[server.SpanContext.SpanID()] {
			switch {
			case c.Name == "acquire provider":
				wait = &c
			case c.SpanKind == trace.SpanKindClient:
				client = &c
			}
		}
		require.NotNil(t, wait, "the wait, a child of the request's span")
		a := attrsOf(wait.Attributes)
		results[a["inflight.result"]] = *wait
		assert.Equal(t, "provider", a["inflight.cap"])
		if a["inflight.result"] == "acquired" {
			require.NotNil(t, client, "the upstream exchange, under the request's span")
			assert.Equal(t, server.SpanContext.TraceID(), client.SpanContext.TraceID())
			assert.Equal(t, "org-a", a["inflight.flow"])
		} else {
			assert.Nil(t, client, "a refused request never went upstream")
		}
	}
	require.Contains(t, results, "acquired")
	require.Contains(t, results, "wait_timeout")
	timedOut := results["wait_timeout"]
	assert.Equal(t, codes.Error, timedOut.Status.Code)
	assert.GreaterOrEqual(t, timedOut.EndTime.Sub(timedOut.StartTime), 300*time.Millisecond, "the span covers the wait")

	requests := requestsByResult(t, reader)
	assert.Equal(t, map[string]int64{"tenant/acquired": 2, "provider/acquired": 1, "provider/wait_timeout": 1}, requests)

	lines := strings.Split(logs.String(), "\n")
	var admittedLine, refusedLine string
	for _, l := range lines {
		switch {
		case strings.Contains(l, `msg="gateway: request"`) && strings.Contains(l, "org=org-a"):
			admittedLine = l
		case strings.Contains(l, `msg="gateway: request"`) && strings.Contains(l, "org=org-b"):
			refusedLine = l
		}
	}
	assert.Contains(t, admittedLine, `caps="[tenant provider]"`)
	assert.Contains(t, refusedLine, "refused_by=provider")
	assert.Regexp(t, `waited=(3\d\d|[4-9]\d\d)(\.\d+)?ms`, refusedLine, "waited its 300 ms")
}

// With telemetry.otlp_endpoint, the spans and the metrics go to the
// collector over OTLP/HTTP; Close sends what is left.
func TestGatewayOTLP(t *testing.T) {
	var mu sync.Mutex
	posts := map[string]int{}
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		posts[r.URL.Path+" "+r.Header.Get("Content-Type")]++
		mu.Unlock()
	}))
	defer collector.Close()
	u := newUpstream(t)
	close(u.gate)
	cfg, err := ParseConfig([]byte(fmt.Sprintf(`{"upstream": %q, "telemetry": {"otlp_endpoint": %q, "service_name": "gw-test"}}`,
		u.srv.URL, collector.URL)))
	require.NoError(t, err)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	gw, err := New(cfg, base)
	require.NoError(t, err)
	srv := httptest.NewServer(gw)
	resp, err := post(context.Background(), t, srv.Client(), srv.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	srv.Close()
	gw.Close()
	mu.Lock()
	defer mu.Unlock()
	assert.Positive(t, posts["/v1/traces application/x-protobuf"], "spans sent: %v", posts)
	assert.Positive(t, posts["/v1/metrics application/x-protobuf"], "metrics sent: %v", posts)
}

func TestConfigTelemetry(t *testing.T) {
	for _, tc := range []struct{ telemetry, err string }{
		{`{"otlp_endpoint": "http://127.0.0.1:4318"}`, ""},
		{`{"otlp_endpoint": "https://collector.internal/otlp", "metrics_interval_ms": 10000}`, ""},
		{`{"otlp_endpoint": "127.0.0.1:4318"}`, "telemetry.otlp_endpoint"},
		{`{}`, "telemetry.otlp_endpoint"},
		{`{"otlp_endpoint": "http://127.0.0.1:4318", "metrics_interval_ms": -1}`, "telemetry.metrics_interval_ms"},
	} {
		_, err := ParseConfig([]byte(`{"upstream": "http://127.0.0.1:1", "telemetry": ` + tc.telemetry + `}`))
		if tc.err == "" {
			assert.NoError(t, err, tc.telemetry)
		} else {
			assert.ErrorContains(t, err, tc.err, tc.telemetry)
		}
	}
}

// An org switched off (a limit of 0) is refused before the tenant cap, and
// counted among the tenant cap's refusals all the same: on /metrics, and
// by the OpenTelemetry adapter, whose wait span on the request's trace
// says why.
func TestGatewayCountsDisabledOrgs(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	u := newUpstream(t)
	close(u.gate)
	srv, _ := startGatewayWith(t, u.srv.URL, `{
		"upstream": "%s",
		"orgs": {"default_limit": 3, "limits": {"org-off": 0}}
	}`, WithTelemetry(tp, mp))

	for range 2 {
		resp, err := post(context.Background(), t, srv.Client(), srv.URL, "org-off", "glm-5.3")
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusForbidden, resp.StatusCode)
	}
	assert.Contains(t, scrape(t, srv.Client(), srv.URL), `inflight_rejected_total{cap="tenant",reason="limit_reached"} 2`)

	requests := requestsByResult(t, reader)
	assert.Equal(t, map[string]int64{"tenant/limit_reached": 2}, requests)
	refusals := 0
	for _, s := range spans.Ended() {
		if s.Name() == "acquire tenant" && attrsOf(s.Attributes())["inflight.result"] == "limit_reached" {
			refusals++
		}
	}
	assert.Equal(t, 2, refusals, "each refusal on its request's trace")
}

// A request over its org's token budget is refused before the provider's
// caps, and counted among the tenant cap's refusals as over_budget (the
// cap admitted it first: two admissions, and one refusal after): on
// /metrics, by the OpenTelemetry adapter (its request's trace says why),
// and in the access log, which names the budget.
func TestGatewayCountsOrgBudgetRefusals(t *testing.T) {
	spans, reader, tel, logs := newTelemetry(t)
	u := newUpstream(t)
	close(u.gate)
	srv, _ := startGatewayWith(t, u.srv.URL, orgCfg, tel...)

	body := `{"model":"glm-5.3","messages":[{"content":"` + strings.Repeat("hello ", 1500) + `"}]}` // over the 1,000 of the minute
	first, _ := sendOrg(t, srv.URL, "org-a", body, nil)
	assert.Equal(t, http.StatusOK, first.StatusCode, "a budget's first request passes, however large")
	refused, msg := sendOrg(t, srv.URL, "org-a", body, nil)
	require.Equal(t, http.StatusTooManyRequests, refused.StatusCode, msg)
	assert.Equal(t, "tenant_"+pacing.CapTokensPerMinute, refused.Header.Get(CapHeader))
	assertRetryAfter(t, refused.Header)

	assert.Contains(t, scrape(t, srv.Client(), srv.URL), `inflight_rejected_total{cap="tenant",reason="over_budget"} 1`)
	assert.Equal(t, map[string]int64{"tenant/acquired": 2, "provider/acquired": 1, "tenant/over_budget": 1}, requestsByResult(t, reader))
	refusals := 0
	for _, s := range spans.GetSpans() {
		if s.Name == "acquire tenant" && attrsOf(s.Attributes)["inflight.result"] == "over_budget" {
			assert.Equal(t, codes.Error, s.Status.Code)
			refusals++
		}
	}
	assert.Equal(t, 1, refusals, "the refusal on its request's trace")
	assert.Contains(t, logs.String(), "refused_by=tenant_"+pacing.CapTokensPerMinute)
}

// newTelemetry is what a gateway's telemetry test reads: its spans,
// exported by the SDK's in-memory exporter (synchronously), its metrics'
// reader, and its log at debug level; tel are the gateway's options that
// send them there.
func newTelemetry(t *testing.T) (spans *tracetest.InMemoryExporter, reader *sdkmetric.ManualReader, tel []Option, logs *testrig.Buffer) {
	spans = tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader = sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	logs = new(testrig.Buffer)
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return spans, reader, []Option{WithTelemetry(tp, mp), WithLogger(log)}, logs
}

// requestsByResult reads inflight.requests from reader, by cap and result
// ("tenant/acquired").
func requestsByResult(t *testing.T, reader sdkmetric.Reader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	requests := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "inflight.requests" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				c, _ := p.Attributes.Value("inflight.cap")
				r, _ := p.Attributes.Value("inflight.result")
				requests[c.String()+"/"+r.String()] += p.Value
			}
		}
	}
	return requests
}

// A request over its org's tenant cap is refused at once (TryAcquire, no
// context), and counted once by the OpenTelemetry adapter all the same:
// with its request's context, so that the refusal is on its trace.
func TestGatewayTracesTenantCapRefusals(t *testing.T) {
	spans, reader, tel, _ := newTelemetry(t)
	u := newUpstream(t)
	srv, _ := startGatewayWith(t, u.srv.URL, `{"upstream": "%s", "orgs": {"default_limit": 1}}`, tel...)

	refuseOverTenantCap(t, srv, u)

	assert.Equal(t, int64(1), requestsByResult(t, reader)["tenant/limit_reached"], "counted once")
	refusals := 0
	for _, s := range spans.GetSpans() {
		if s.Name == "acquire tenant" && attrsOf(s.Attributes)["inflight.result"] == "limit_reached" {
			assert.Equal(t, codes.Error, s.Status.Code)
			assert.True(t, s.Parent.IsValid(), "a child of the request's span")
			refusals++
		}
	}
	assert.Equal(t, 1, refusals, "the refusal on its request's trace")
}

// With a fleet the store refuses a request over its org's tenant cap, not
// this gateway's registry: the refusal is counted all the same, once, on
// /metrics and by the OpenTelemetry adapter. Before, /metrics counted none.
func TestGatewayCountsFleetTenantRefusals(t *testing.T) {
	_, reader, tel, _ := newTelemetry(t)
	u := newUpstream(t)
	srv, _ := startGatewayWith(t, u.srv.URL, `{"upstream": "%s", "orgs": {"default_limit": 1},
		"fleet": {"redis_url": "redis://`+redistest.Start(t).Addr+`/0"}}`, tel...)
	refuseOverTenantCap(t, srv, u)

	assert.Contains(t, scrape(t, srv.Client(), srv.URL), `inflight_rejected_total{cap="tenant",reason="limit_reached"} 1`)
	assert.Equal(t, int64(1), requestsByResult(t, reader)["tenant/limit_reached"])
}

// A tenant slot held past the sweep's threshold is exported over
// OpenTelemetry as inflight.slot.long_held, and no longer once it is
// released. Before, the gateway's Monitor only logged it.
func TestGatewayExportsLongHeldSlots(t *testing.T) {
	_, reader, tel, _ := newTelemetry(t)
	u := newUpstream(t)
	opts := append(tel, WithSweep(sweep.WithInterval(5*time.Millisecond), sweep.WithThreshold(time.Millisecond)))
	srv, _ := startGatewayWith(t, u.srv.URL, `{"upstream": "%s"}`, opts...)
	held := holdStream(t, srv)
	waitFor(t, "the stream's tenant slot exported as long held", func() bool { return longHeld(t, reader) == 1 })
	close(u.gate)
	_, _ = io.Copy(io.Discard, held.Body)
	require.NoError(t, held.Body.Close())
	waitFor(t, "no slot held long once it is released", func() bool { return longHeld(t, reader) == 0 })
}

// longHeld reads the tenant cap's inflight.slot.long_held from reader.
func longHeld(t *testing.T, reader sdkmetric.Reader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "inflight.slot.long_held" {
				continue
			}
			for _, p := range m.Data.(metricdata.Gauge[int64]).DataPoints {
				if c, _ := p.Attributes.Value("inflight.cap"); c.AsString() == "tenant" {
					return p.Value
				}
			}
		}
	}
	return -1
}

// assertRetryAfter checks a refusal's Retry-After: retry-after-ms to the
// millisecond, which the OpenAI and Anthropic SDKs read first, and the
// same in whole seconds, rounded up.
func assertRetryAfter(t *testing.T, h http.Header) (ms int) {
	t.Helper()
	ms, err := strconv.Atoi(h.Get("Retry-After-Ms"))
	require.NoError(t, err, "retry-after-ms, to the millisecond")
	assert.Positive(t, ms)
	secs, err := strconv.Atoi(h.Get("Retry-After"))
	require.NoError(t, err)
	assert.Equal(t, max((ms+999)/1000, 1), secs, "Retry-After: the same, in whole seconds rounded up")
	return ms
}

// holdStream starts a stream of org-a, which lasts until u's gate opens.
// Its body is closed at the test's end, should the test fail first: the
// upstream waits for it.
func holdStream(t *testing.T, srv *httptest.Server) *http.Response {
	t.Helper()
	held, err := post(context.Background(), t, srv.Client(), srv.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	t.Cleanup(func() { held.Body.Close() })
	require.Equal(t, http.StatusOK, held.StatusCode)
	return held
}

// refuseOverTenantCap holds a stream of org-a, at a tenant cap of 1, while
// a second request of it is refused with a Retry-After; then the stream
// ends.
func refuseOverTenantCap(t *testing.T, srv *httptest.Server, u *upstream) {
	t.Helper()
	held := holdStream(t, srv)
	refused, err := post(context.Background(), t, srv.Client(), srv.URL, "org-a", "glm-5.3")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, refused.Body)
	require.NoError(t, refused.Body.Close())
	require.Equal(t, http.StatusTooManyRequests, refused.StatusCode)
	assertRetryAfter(t, refused.Header)
	close(u.gate)
	_, _ = io.Copy(io.Discard, held.Body)
	require.NoError(t, held.Body.Close())
}
