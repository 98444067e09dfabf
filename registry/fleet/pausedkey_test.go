package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// An AcquireAll waiting on a paused key (a limit of 0) keeps no place of
// its other keys in Redis's queues, however often passed over: it cannot
// be served until the pause is lifted, and the place it kept stopped a
// provider key of limit 1 for good, with nothing in flight. Found by
// review (the local registry had the same fault).
func TestTicketOnAPausedKeyKeepsNoPlace(t *testing.T) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 1) // queuedIn reads the name "qw"
	defer r.Close()
	r.SetLimit("m1", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, err := r.TryAcquire("p")
	require.NoError(t, err)
	go func() { _, _ = r.AcquireAll(ctx, "p", "m1") }()
	eventually(t, "the waiter on p and the paused m1 queued", func() bool { return queuedIn(t, srv, "p") == 1 })
	got := make(chan *slots.Slot, registry.MaxPassed+2)
	for i := range registry.MaxPassed + 2 {
		go func() {
			if s, err := r.AcquireAll(ctx, "p", "m2"); err == nil {
				got <- s
			}
		}()
		eventually(t, fmt.Sprint("waiter ", i+1, " of p and m2 queued"), func() bool { return queuedIn(t, srv, "p") == i+2 })
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
