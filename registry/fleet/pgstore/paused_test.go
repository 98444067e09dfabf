package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/slots"
)

// An AcquireAll waiting on a paused key (a limit of 0) keeps no place of
// its other keys, however often passed over: it cannot be served until
// the pause is lifted. Before revision 14 the place kept for it stopped a
// provider key of limit 1 for good, with nothing in flight (found by
// review; as on Redis and in the local registry).
func TestTicketOnAPausedKeyKeepsNoPlace(t *testing.T) {
	srv := pgtest.Start(t)
	r := process(t, srv, "paused", 1)
	admin := pool(t, srv, 2)
	r.SetLimit("m1", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, err := r.TryAcquire("p")
	require.NoError(t, err)
	go func() { _, _ = r.AcquireAll(ctx, "p", "m1") }()
	waitQueued(t, admin, "p", 1)
	got := make(chan *slots.Slot, registry.MaxPassed+2)
	for i := range registry.MaxPassed + 2 {
		go func() {
			if s, err := r.AcquireAll(ctx, "p", "m2"); err == nil {
				got <- s
			}
		}()
		waitQueued(t, admin, "p", i+2)
	}
	// Each release hands p to the next waiter of p and m2, passing the
	// one on m1 over: past registry.MaxPassed, p goes on being served.
	for i := range registry.MaxPassed + 2 {
		held.Release()
		select {
		case held = <-got:
		case <-time.After(10 * time.Second): // a bound on a hang
			n, _ := r.InFlight(context.Background(), "p")
			t.Fatalf("grant %d of p not made (%d in flight): its place kept for the waiter on a paused key", i+1, n)
		}
	}
	held.Release()
}

// waitQueued waits until n tickets queue on key of the fleet "paused".
func waitQueued(t *testing.T, admin *pgxpool.Pool, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var got int
		err := admin.QueryRow(context.Background(), "SELECT count(*) FROM inflight_ticket WHERE fleet = 'paused' AND key = $1",
			pgstore.StoredKey(key)).Scan(&got)
		return err == nil && got == n
	}, 10*time.Second, 5*time.Millisecond, fmt.Sprintf("%d queued on %s", n, key))
}
