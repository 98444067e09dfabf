// Package readme holds the Go code of the repository's README.md, so that
// it compiles; readme_test.go checks that every Go block of the README is
// here, verbatim, and runs the recipes against real servers.
package readme

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
	"github.com/inflight-go/inflight/sweep/inflightotel"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// LimitProvider puts a provider's caps in front of an existing reverse
// proxy: 8 requests in flight at most, of which glm-5 takes as many as
// the provider's 429s show it allows (3 at most), each sent with one of
// two API keys of 4 each. A request waits its turn (60 s at most), holds
// its slots until its streamed answer ends, and is answered 429 with
// Retry-After if its turn does not come.
func LimitProvider(proxy *httputil.ReverseProxy, secrets map[string]string) (*pacing.Gate, error) {
	gate, err := pacing.NewGate("provider", pacing.Config{
		MaxConcurrentRequests: 8,
		Models:                map[string]pacing.ModelConfig{"glm-5": {Adaptive: &pacing.AdaptiveConfig{Max: 3}}},
		APIKeys:               []pacing.KeyConfig{{ID: "a", MaxConcurrentRequests: 4}, {ID: "b", MaxConcurrentRequests: 4}},
	})
	if err != nil {
		return nil, err
	}
	proxy.Transport = pacing.NewTransport(proxy.Transport, gate, pacing.WithCredential(pacing.BearerKeys(secrets)))
	proxy.ErrorHandler = slots.ProxyErrorHandler()
	return gate, nil
}

// NewCappedClient returns an HTTP client that has at most 8 requests in
// flight to its upstreams. A streamed answer keeps its slot until its body
// is read to the end or closed, or its request's context ends: not just
// until RoundTrip returns. A request that waits 30 s goes ahead without a
// slot (WithFailOpen), so a hung upstream cannot stall every caller.
func NewCappedClient() (*http.Client, *slots.Limiter) {
	lim := slots.NewLimiter(8, slots.WithMaxWait(30*time.Second), slots.WithFailOpen())
	admit := func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }
	return &http.Client{Transport: slots.NewTransport(nil, admit)}, lim
}

type modelKey struct{}

// NewProxy is a reverse proxy to upstream with two caps taken together, all
// or nothing: 5 requests in flight to the provider, 2 of them at most for
// the model glm-5. A request waits up to maxWait for both; then it gets a
// 429 with Retry-After. The handler finds the model (here in a header; the
// example gateway reads the JSON body) and hands it to the Transport in the
// context, since a Transport must not read the body it sends.
// ProxyErrorHandler answers admission errors as 429 or 503 and upstream
// errors as 502; without it ReverseProxy answers every rejection with an
// empty 502.
func NewProxy(upstream *url.URL, maxWait time.Duration) (http.Handler, *registry.Registry[string]) {
	reg := registry.New[string](slots.Unlimited, slots.WithMaxWait(maxWait))
	reg.SetLimit("provider", 5)
	reg.SetLimit("model:glm-5", 2)
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(upstream) },
		Transport: slots.NewTransport(nil, func(r *http.Request) (*slots.Slot, error) {
			model, _ := r.Context().Value(modelKey{}).(string)
			return reg.AcquireAll(r.Context(), "provider", "model:"+model)
		}),
		ErrorHandler: slots.ProxyErrorHandler(),
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := context.WithValue(r.Context(), modelKey{}, r.Header.Get("X-Model"))
		proxy.ServeHTTP(w, r.WithContext(ctx))
	})
	return handler, reg
}

// Prioritised admits a caller of org to lim as interactive: interactive
// callers go before batch ones, and orgs take turns within a class.
func Prioritised(ctx context.Context, lim *slots.Limiter, org string) (*slots.Slot, error) {
	ctx = slots.WithFlow(slots.WithPriority(ctx, slots.PriorityInteractive), org)
	return lim.Acquire(ctx)
}

// NewSharedLimiter has 5 slots, of which batch work always keeps one while
// it waits, so it never starves behind interactive work.
func NewSharedLimiter() *slots.Limiter {
	return slots.NewLimiter(5, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
}

// NewServer caps a server's own handlers at 100 in flight (a streaming
// handler holds its slot for the whole stream), with 50 waiting at most;
// a rejection is a 429 with Retry-After and a JSON reason
// ({"error":{"type":"rate_limit_error",...}}), or what WithErrorWriter
// writes. /debug/slots lists what holds the cap: serve it behind your
// operators' access control.
func NewServer(app http.Handler) http.Handler {
	lim := slots.NewLimiter(100, slots.WithMaxQueue(50))
	admit := func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }
	mux := http.NewServeMux()
	mux.Handle("/", slots.Middleware(admit)(app))
	mux.Handle("GET /debug/slots", sweep.LimiterHandler(lim))
	return mux
}

// FleetOnRedis caps each key at 64 holders across every process of the
// fleet "gateway" on the Redis behind rdb.
func FleetOnRedis(rdb redis.UniversalClient) *fleet.Registry[string] {
	return fleet.New[string](redisstore.New(rdb, "gateway"), 64)
}

// FleetOnPostgres is the same fleet on the PostgreSQL database behind
// pool; pgstore.New makes its tables once, safely from every replica at
// once. A call waits for a pooled connection and a transaction: give it
// longer than the default 500 ms before it counts as failed.
func FleetOnPostgres(ctx context.Context, pool *pgxpool.Pool) (*fleet.Registry[string], error) {
	store, err := pgstore.New(ctx, pool, "gateway")
	if err != nil {
		return nil, err
	}
	return fleet.New[string](store, 64, fleet.WithTimeout(2*time.Second)), nil
}

// NewObservedServer caps a server's handlers at 100 in flight, seen from
// outside: the cap's series on a Prometheus registry (served as /metrics)
// and on OpenTelemetry, and each request's wait for a slot as a span of
// the request's trace, under the span otelhttp's handler gives it. An
// Observer is one value, so one function calls both adapters. (A Cap given
// alone, slots.WithObserver(ot), is asked first whether it wants each
// Event: without an SDK or a span, it costs next to nothing.)
func NewObservedServer(app http.Handler) (http.Handler, error) {
	prom := inflightprom.New("server")
	ot, err := inflightotel.New("server") // metrics to otel.GetMeterProvider()
	if err != nil {
		return nil, err
	}
	both := slots.ObserverFunc(func(e slots.Event) { prom.Observe(e); ot.Observe(e) })
	lim := slots.NewLimiter(100, slots.WithMaxQueue(50), slots.WithObserver(both))
	inflightprom.WatchLimiter(prom, lim)
	inflightotel.WatchLimiter(ot, lim)
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(prom)
	admit := func(r *http.Request) (*slots.Slot, error) { return lim.Acquire(r.Context()) }
	mux := http.NewServeMux()
	mux.Handle("/", otelhttp.NewHandler(slots.Middleware(admit)(app), "app"))
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	return mux, nil
}
