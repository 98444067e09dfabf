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

// An admission of each kind, the store's and one outside it, counts the
// other when their checks and their records interleave: each is counted
// from before it tries the local registry. holdHook runs the other
// admission between the first one's checks and its record, where neither
// count was seen before: a store's admission refused by the local
// registry (on a limit not refreshed yet) was counted only once recorded,
// and a lease admitted outside the store only once recorded too. Each
// ended with 3 held against a limit of 2.
func TestAdmissionsOfBothKindsCountEachOtherMidway(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first string // "store" or "outside"
	}{
		{name: "an admission outside the store midway through the store's", first: "store"},
		{name: "the store's admission midway through one outside it", first: "outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				ms := memstore.New()
				st := &heldWhenArmed{Store: ms}
				var limit atomic.Int64
				limit.Store(2)
				if tc.first == "store" {
					limit.Store(1)
				}
				r := NewWithKeys[string](st, 1, Keys[string]{Limit: func(string) int { return int(limit.Load()) }},
					WithLeaseTTL(30*time.Second), WithLogger(quiet()))
				defer r.Close()
				a, err := r.TryAcquire("k")
				require.NoError(t, err)
				defer a.Release()

				var held []*slots.Slot
				defer func() {
					for _, s := range held {
						s.Release()
					}
				}()
				var armed atomic.Bool
				armed.Store(true)
				var second error
				r.holdHook = func() {
					if !armed.CompareAndSwap(true, false) {
						return
					}
					var s *slots.Slot
					if tc.first == "store" {
						// The store admitted the first one, which the
						// local registry, on the limit 1, refused. Now
						// the local limit is 2, and the store fails.
						time.Sleep(LocalLimitRefresh + time.Millisecond)
						st.failing.Store(1)
						s, second = r.TryAcquire("k")
						assert.Zero(t, st.failing.Load(), "its call failed: refused, if so, outside the store")
						if second == nil {
							assert.True(t, s.Degraded())
						}
					} else {
						// The first is admitted outside the store, with
						// its local slot; the store then admits one
						// beside a, not knowing the first.
						s, second = r.TryAcquire("k")
						assert.Equal(t, int32(-1), st.failing.Load(), "the store decided it: refused, if so, as it was held")
						if second == nil {
							assert.False(t, s.Degraded())
						}
					}
					if second == nil {
						held = append(held, s)
					}
				}
				if tc.first == "store" {
					limit.Store(2) // the store learns it now, the local registry a LocalLimitRefresh later
				} else {
					st.failing.Store(1)
				}
				s, err := r.TryAcquire("k")
				require.NoError(t, err)
				held = append(held, s)
				assert.False(t, armed.Load(), "the hook ran")
				assert.ErrorIs(t, second, slots.ErrLimitReached, "the second admission, beside the first")
				assert.Equal(t, 2, r.Stats().Held)
				assert.LessOrEqual(t, r.localHeld("k"), 2, "held in this process, with the limit 2")
				for _, s := range held {
					s.Release()
				}
				held = nil
				countsAreZero(t, r) // a, with its local slot, counts in neither
			})
		})
	}
}
