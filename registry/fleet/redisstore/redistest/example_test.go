package redistest_test

import (
	"errors"
	"testing"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// fleetOnRedis is a test of a program's fleet caps on a real redis-server
// (TestFleetOnRedis runs it): Start runs one for the test and stops it at
// the test's cleanup (the test is skipped without the binary, unless
// RequireEnv is set), and two Registries on it share the cap as two
// processes would, one of them through a Proxy that can cut it off the
// server (Cut, then Heal). Kill, Stop and Restart put the server itself
// through a crash or a hang.
func fleetOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	a := fleet.New[string](redisstore.New(srv.Client(), "gateway"), 1)
	t.Cleanup(a.Close)
	b := fleet.New[string](redisstore.New(redistest.StartProxy(t, srv).Client(), "gateway"), 1)
	t.Cleanup(b.Close)

	held, err := a.TryAcquire("upstream")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire("upstream"); !errors.Is(err, slots.ErrLimitReached) {
		t.Errorf("the other process admitted over the fleet's cap of 1: %v", err)
	}
	held.Release()
}

func ExampleStart() {
	_ = fleetOnRedis // func TestFleetOnRedis(t *testing.T) { fleetOnRedis(t) }
}
