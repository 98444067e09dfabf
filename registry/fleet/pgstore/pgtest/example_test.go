package pgtest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/slots"
)

// fleetOnPostgres is a test of a program's fleet caps on a real PostgreSQL
// (TestFleetOnPostgres runs it): Start makes a cluster for the test and
// removes it at the test's cleanup (the test is skipped without the
// server's binaries, unless RequireEnv is set), and two Registries on it,
// each with a pool of its own, share the cap as two processes would.
// Kill, Restart, Stop and Cont put the server through a crash or a hang,
// and Bouncer puts PgBouncer in front of it.
func fleetOnPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	process := func() *fleet.Registry[string] {
		pool, err := pgxpool.New(context.Background(), srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		store, err := pgstore.New(context.Background(), pool, "gateway")
		if err != nil {
			t.Fatal(err)
		}
		r := fleet.New[string](store, 1)
		t.Cleanup(r.Close)
		return r
	}
	a, b := process(), process()

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
	_ = fleetOnPostgres // func TestFleetOnPostgres(t *testing.T) { fleetOnPostgres(t) }
}
