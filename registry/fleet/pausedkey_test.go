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

// AcquireAlls waiting on a paused key (a limit of 0) keep no place of
// their other keys in Redis's queues, however often passed over: they
// cannot be served until the pause is lifted, and the place kept for one
// stopped a provider key of limit 1 for good, with nothing in flight.
// Found by review (the local registry had the same fault); a second
// review found that looking past them in the urgent ones made every
// serving cost up to 64 times more, and that more than 64 stopped the key
// again: they are no longer among them.
func TestTicketOnAPausedKeyKeepsNoPlace(t *testing.T) {
	// One of them, and more than a key looks at for its urgent tickets
	// (driver.PassScan).
	for _, onPaused := range []int{1, 70} {
		t.Run(fmt.Sprint(onPaused), func(t *testing.T) { testTicketOnAPausedKey(t, onPaused) })
	}
}

func testTicketOnAPausedKey(t *testing.T, onPaused int) {
	srv := redistest.Start(t)
	r := New[string](redisstore.New(srv.Client(), "qw"), 1) // queuedIn reads the name "qw"
	defer r.Close()
	r.SetLimit("m1", 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held, err := r.TryAcquire("p")
	require.NoError(t, err)
	for range onPaused {
		go func() { _, _ = r.AcquireAll(ctx, "p", "m1") }()
	}
	eventually(t, "the waiters on p and the paused m1 queued", func() bool { return queuedIn(t, srv, "p") == onPaused })
	got := make(chan *slots.Slot, registry.MaxPassed+2)
	for i := range registry.MaxPassed + 2 {
		go func() {
			if s, err := r.AcquireAll(ctx, "p", "m2"); err == nil {
				got <- s
			}
		}()
		eventually(t, fmt.Sprint("waiter ", i+1, " of p and m2 queued"), func() bool { return queuedIn(t, srv, "p") == onPaused+i+1 })
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
	urgent, err := srv.Client().ZCard(context.Background(), "inflight:{qw}:p#u").Result()
	require.NoError(t, err)
	require.Zero(t, urgent, "no waiter on a paused key among p's urgent ones")
}
