package fleettest_test

import (
	"sync"
	"testing"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// A store's module runs the suite from a test of its own, with a Server
// that starts the store's server for the test and gives each process of a
// fleet a client of it. Here the store is memstore, one Store per fleet
// name; a store on a real server (Redis, PostgreSQL) starts that server in
// start and returns clients connected to it, and offers Faults and
// Proxied so that the suite also kills, hangs and cuts it off.
func ExampleRun() {
	conformance := func(t *testing.T) {
		fleettest.Run(t, func(t *testing.T) fleettest.Server { return &memServer{fleets: map[string]*memstore.Store{}} })
	}
	_ = conformance // func TestConformance(t *testing.T) { conformance(t) }
}

// The same Server measures the store: Bench's figures (the share of a
// cache that small requests use while large ones wait, and when they are
// done) are the store's speed as much as the fleet's rules, so run it on
// the store's real server, with -benchtime 1x.
func ExampleBench() {
	measure := func(b *testing.B) {
		fleettest.Bench(b, &memServer{fleets: map[string]*memstore.Store{}})
	}
	_ = measure // func BenchmarkFleet(b *testing.B) { measure(b) }
}

type memServer struct {
	mu     sync.Mutex
	fleets map[string]*memstore.Store
}

func (s *memServer) fleet(name string) *memstore.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fleets[name] == nil {
		s.fleets[name] = memstore.New()
	}
	return s.fleets[name]
}

func (s *memServer) Store(_ testing.TB, fleet string) driver.Store { return s.fleet(fleet) }

func (s *memServer) Queued(fleet, key string) (int, error) { return s.fleet(fleet).Queued(key), nil }
