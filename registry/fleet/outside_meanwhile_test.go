package fleet

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A lease admitted outside the store while another caller's call is on
// its way counts for that call's admission (see
// TestLeaseAdmittedOutsideTheStoreMeanwhileCounts), also when this process
// holds a lease without a local slot: the local registry, which does not
// count that one, has room for the store's admission, yet with it the
// process holds more than the limit. Before, it held 3 of a cap of 2: a
// lease held without a mirror, the one admitted outside the store, and the
// store's admission, which the heartbeat then put into the store beside
// the lease admitted outside it.
func TestLeaseOutsideTheStoreMeanwhileCountsBesideAnUnmirroredOne(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		st := &heldWhenArmed{Store: ms, arrived: make(chan struct{}), open: make(chan struct{})}
		var limit atomic.Int64
		limit.Store(1)
		r := NewWithKeys[string](st, 1, Keys[string]{Limit: func(string) int { return int(limit.Load()) }},
			WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		defer r.Close()
		a, err := r.TryAcquire("k") // the local registry has the limit 1
		require.NoError(t, err)
		limit.Store(2)
		b, err := r.TryAcquire("k") // the store's 2nd; no room under the local 1
		require.NoError(t, err)
		defer b.Release()
		unmirroredIs(t, r, 1)
		a.Release()
		require.Eventually(t, func() bool {
			n, err := ms.Count(context.Background(), "k")
			return err == nil && n == 1
		}, 5*time.Second, time.Millisecond, "a's release in the store")
		time.Sleep(LocalLimitRefresh + time.Millisecond) // the local limit catches up at the next admission

		// c's call is held at the store; d's fails: admitted outside the
		// store (1 local slot + b = 2 of 2). Then c's call, which carried
		// no d, finds 1 of 2 in the store.
		d, err := whileHeld(t, r, st, func() (*slots.Slot, error) {
			s, err := r.TryAcquire("k")
			if err == nil {
				assert.LessOrEqual(t, r.localHeld("k"), 2, "held with b and d, which the store's admission did not count")
			}
			return s, err
		}, "k")
		defer d.Release()
		assert.ErrorIs(t, err, slots.ErrLimitReached, "the store admitted it without the lease held outside the store")
		assert.Equal(t, 2, r.Stats().Held)
	})
}
