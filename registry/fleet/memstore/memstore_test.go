package memstore_test

import (
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The conformance suite, faults included, on stores in memory: one Store
// per fleet name, shared by the fleet's processes.
func TestConformance(t *testing.T) {
	fleettest.Run(t, func(t *testing.T) fleettest.Server { return &server{fleets: map[string]*memstore.Store{}} })
}

// BenchmarkFleet runs the conformance suite's measurements
// (fleettest.Bench) on stores in memory: the figures without a server's
// round trips.
//
//	go test -run '^$' -bench Fleet -benchtime 1x ./registry/fleet/memstore
func BenchmarkFleet(b *testing.B) {
	fleettest.Bench(b, &server{fleets: map[string]*memstore.Store{}})
}

type server struct {
	mu     sync.Mutex
	fleets map[string]*memstore.Store
}

func (s *server) fleet(name string) *memstore.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.fleets[name]
	if st == nil {
		st = memstore.New()
		s.fleets[name] = st
	}
	return st
}

func (s *server) each(f func(*memstore.Store)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.fleets {
		f(st)
	}
}

func (s *server) Store(_ testing.TB, fleet string) driver.Store { return s.fleet(fleet) }

func (s *server) Queued(fleet, key string) (int, error) { return s.fleet(fleet).Queued(key), nil }

func (s *server) Kill()    { s.each((*memstore.Store).Kill) }
func (s *server) Restart() { s.each((*memstore.Store).Restart) }
func (s *server) Stop()    { s.each((*memstore.Store).Stop) }
func (s *server) Cont()    { s.each((*memstore.Store).Cont) }
func (s *server) Lose()    { s.each((*memstore.Store).Lose) }
