package inflightprom_test

import (
	"fmt"
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
# HELP inflight_in_flight Slots held now; a slot held under several keys counts once per key.
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
