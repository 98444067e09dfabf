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

// countsAreZero asserts that r counts no lease held without a local slot
// and none outside the store.
func countsAreZero(t *testing.T, r *Registry[string]) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	assert.Empty(t, r.held.unmirrored, "units held without a local slot")
	assert.Empty(t, r.held.outside, "leases outside the store")
}

// a lease admitted outside the store after a store's admission
// was decided, and carried into the store by another call before that
// admission is held, is no longer counted outside the store when the
// admission checks (outsideMeanwhile): the store admitted it without
// that lease, the local registry refuses it (full with the lease), and
// it is held all the same, without a local slot: 3 held of a limit of 2.
func TestLeaseCarriedInBeforeTheStoresAdmissionIsHeldCounts(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		st := &heldWhenArmed{Store: ms, decided: true, arrived: make(chan struct{}), open: make(chan struct{})}
		r := New[string](st, 2, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		defer r.Close()
		a, err := r.TryAcquire("k")
		require.NoError(t, err)
		defer a.Release()

		st.armed.Store(true)
		type result struct {
			s   *slots.Slot
			err error
		}
		done := make(chan result, 1)
		go func() {
			s, err := r.TryAcquire("k") // the store admits it: 2 of 2
			done <- result{s, err}
		}()
		<-st.arrived
		st.failing.Store(1)
		d, err := r.TryAcquire("k") // outside the store: a and d, 2 of 2 here
		require.NoError(t, err)
		defer d.Release()
		require.True(t, d.Degraded())
		_, err = r.TryAcquire("k") // its call carries d in: 3 in the store, refused
		require.ErrorIs(t, err, slots.ErrLimitReached)
		require.False(t, r.hasDegraded(), "d is in the store now")
		close(st.open)
		res := <-done
		if res.err == nil {
			defer res.s.Release()
		}
		assert.ErrorIs(t, res.err, slots.ErrLimitReached, "admitted by the store without d, which this process holds")
		assert.LessOrEqual(t, r.localHeld("k"), 2, "held in this process, with the limit 2")
	})
}

// the counts hold taken before the local slot is tried
// (unmirrored for the store's admissions, outside for the others) end on
// every way out of an admission, and with the lease once held: nothing
// counts once all is released.
func TestAdmissionCountsEndOnEveryPath(t *testing.T) {
	for _, tc := range []struct {
		name     string
		outside  bool // admitted outside the store (its calls fail)
		limit    int  // the limit, 1 held already; 0: 2
		raise    bool // the store's limit raised to 3 past the local one: held without a local slot
		panics   bool // the local registry's Observer panics on the admission
		cancel   bool // the caller's context ends at the record
		close    bool // the Registry closes at the record
		admitted bool
	}{
		{name: "store, admitted", admitted: true},
		{name: "store, without a local slot", raise: true, admitted: true},
		{name: "store, local Observer panics", panics: true},
		{name: "store, context ends at the record", cancel: true},
		{name: "store without a local slot, context ends at the record", raise: true, cancel: true},
		{name: "store, closed at the record", close: true},
		{name: "store without a local slot, closed at the record", raise: true, close: true},
		{name: "outside, admitted", outside: true, admitted: true},
		{name: "outside, refused: full", outside: true, limit: 1},
		{name: "outside, local Observer panics", outside: true, panics: true},
		{name: "outside, context ends at the record", outside: true, cancel: true},
		{name: "outside, closed at the record", outside: true, close: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				ms := memstore.New()
				st := &heldWhenArmed{Store: ms}
				var limit atomic.Int64
				limit.Store(int64(max(tc.limit, 2)))
				if tc.limit == 1 {
					limit.Store(1)
				}
				var boom atomic.Bool
				obs := slots.ObserverFunc(func(e slots.Event) {
					if e.Kind == slots.EventAcquired && boom.Load() {
						panic("boom")
					}
				})
				r := NewWithKeys[string](st, 1, Keys[string]{Limit: func(string) int { return int(limit.Load()) }},
					WithLeaseTTL(30*time.Second), WithLogger(quiet()), WithLocalOptions(slots.WithObserver(obs)))
				defer r.Close()
				a, err := r.TryAcquire("k")
				require.NoError(t, err)
				if tc.raise {
					b, err := r.TryAcquire("k")
					require.NoError(t, err)
					defer b.Release()
					limit.Store(3) // the store's now; the local registry's later
				}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				r.holdHook = func() {
					switch {
					case tc.cancel:
						cancel()
					case tc.close:
						r.Close()
					}
				}
				if tc.outside {
					st.failing.Store(1)
				}
				boom.Store(tc.panics)
				var s *slots.Slot
				if tc.panics {
					assert.PanicsWithValue(t, "boom", func() { _, _ = r.Acquire(ctx, "k") })
				} else if tc.admitted || tc.cancel || tc.close {
					s, err = r.Acquire(ctx, "k")
				} else {
					s, err = r.TryAcquire("k") // refused: Acquire would wait
				}
				boom.Store(false)
				if tc.admitted {
					require.NoError(t, err)
					assert.Equal(t, tc.outside, s.Degraded())
					s.Release()
				} else if !tc.panics {
					assert.Error(t, err)
				}
				a.Release()
				countsAreZero(t, r)
			})
		})
	}
}

// a lease admitted outside the store and carried into it by
// another admission's call no longer counts outside it, and stops being
// counted once (not again at its release).
func TestCarriedInLeaseCountsOutsideOnce(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		st := &heldWhenArmed{Store: ms}
		r := New[string](st, 2, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		defer r.Close()
		st.failing.Store(1)
		d, err := r.TryAcquire("k")
		require.NoError(t, err)
		require.True(t, d.Degraded())
		r.mu.Lock()
		assert.Equal(t, map[string]int{"k": 1}, r.held.outside)
		r.mu.Unlock()
		s, err := r.TryAcquire("k") // carries d in
		require.NoError(t, err)
		require.False(t, r.hasDegraded())
		countsAreZero(t, r)
		d.Release()
		s.Release()
		countsAreZero(t, r)
		require.Eventually(t, func() bool { // all the room back
			n, err := r.TryAcquireN("k", 2)
			if err == nil {
				n.Release()
			}
			return err == nil
		}, 5*time.Second, time.Millisecond)
	})
}
