package inflightprom_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

func ExampleNew() {
	c := inflightprom.New("tenant")
	reg := registry.New[string](64, slots.WithObserver(c))
	inflightprom.WatchRegistry(c, reg)

	registerer := prometheus.NewRegistry() // prometheus.MustRegister(c) in a program
	registerer.MustRegister(c)

	s, _ := reg.TryAcquire("org-a")
	defer s.Release()
	err := testutil.GatherAndCompare(registerer, strings.NewReader(`
# HELP inflight_in_flight Units held now (one per slot unless weighted); a slot held under several keys counts under each.
# TYPE inflight_in_flight gauge
inflight_in_flight{cap="tenant"} 1
`), "inflight_in_flight")
	fmt.Println(err)
	// Output: <nil>
}

func ExampleNewLearnedCaps() {
	gate, _ := pacing.NewGate("zai", pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 8, Max: 32}})
	defer gate.Close()
	registerer := prometheus.NewRegistry() // prometheus.MustRegister in a program
	registerer.MustRegister(inflightprom.NewLearnedCaps("zai", gate))

	err := testutil.GatherAndCompare(registerer, strings.NewReader(`
# HELP inflight_learned_cap The learned cap: starts up to it go without a test.
# TYPE inflight_learned_cap gauge
inflight_learned_cap{cap="provider",provider="zai"} 8
# HELP inflight_learned_max The highest the learned cap may go, as configured.
# TYPE inflight_learned_max gauge
inflight_learned_max{cap="provider",provider="zai"} 32
`), "inflight_learned_cap", "inflight_learned_max")
	fmt.Println(err)
	// Output: <nil>
}

func ExampleNewProvider() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"choices":[]}`)
	}))
	defer upstream.Close()

	cfg := pacing.Config{MaxConcurrentRequests: 4, Models: map[string]pacing.ModelConfig{"glm-5": {MaxConcurrentRequests: 2}}}
	gate, _ := pacing.NewGate("zai", cfg)
	defer gate.Close()
	caps := inflightprom.NewProvider(gate, cfg)
	registerer := prometheus.NewRegistry() // prometheus.MustRegister(caps) in a program
	registerer.MustRegister(caps)
	client := &http.Client{Transport: pacing.NewTransport(upstream.Client().Transport, gate)}

	// Each request carries the Trace of its model's cap, beside any of the
	// program's own.
	ctx := pacing.WithTrace(context.Background(), caps.Trace("glm-5"))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, upstream.URL, strings.NewReader(`{"model":"glm-5"}`))
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // frees its slots: released

	err = testutil.GatherAndCompare(registerer, strings.NewReader(`
# HELP inflight_limit The limit; +Inf when unlimited.
# TYPE inflight_limit gauge
inflight_limit{cap="model:glm-5"} 2
inflight_limit{cap="model:other"} +Inf
inflight_limit{cap="provider"} 4
# HELP inflight_released_total Capacity given back.
# TYPE inflight_released_total counter
inflight_released_total{cap="model:glm-5"} 1
inflight_released_total{cap="model:other"} 0
inflight_released_total{cap="provider"} 1
`), "inflight_limit", "inflight_released_total")
	fmt.Println(err)
	// Output: <nil>
}
