package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// With telemetry whose spans are not sampled and whose metrics go nowhere
// (the provider's inflightotel Cap records nothing, and its Trace is nil),
// a refusal by a fleet's budget of the provider is answered 429 all the
// same. Before, providerRefused called Refused on the nil Trace: the
// handler panicked and the client's connection was cut.
func TestGatewayQuietTelemetryProviderBudgetRefusal(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":60,"completion_tokens":40}}`)
	}))
	t.Cleanup(up.Close)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	srv, _ := startGatewayWith(t, up.URL, `{"upstream": "%s",
		"tokens": {"expected_output": 50},
		"provider": {"max_queue_wait_ms": 50, "tokens_per_minute": 300},
		"fleet": {`+fleetStores["redis"](t)+`}}`, WithTelemetry(tp, metricnoop.NewMeterProvider()))
	refused := false
	for i := 0; i < 10 && !refused; i++ {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","messages":[{"content":"hello"}]}`))
		require.NoError(t, err)
		req.Header.Set(OrgHeader, "org-a")
		resp, err := srv.Client().Do(req)
		require.NoError(t, err, "request %d answered", i)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		refused = resp.StatusCode == http.StatusTooManyRequests
	}
	assert.True(t, refused, "the provider's budget refused one")
}
