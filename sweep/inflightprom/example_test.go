package inflightprom_test

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
