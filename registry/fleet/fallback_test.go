package fleet

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// FallbackLocal caps a process at its keys' limits (package doc). A
// limit raised through Keys.Limit reaches the local registry up to a
// LocalLimitRefresh late: a lease the store admits meanwhile is held
// without a mirror slot there. Once the local limit had caught up, and
// the store then failed, the local registry admitted one more than the
// limit: it did not count that lease.
func TestFallbackCountsLeasesHeldWithoutAMirror(t *testing.T) {
	for _, tc := range []struct {
		name  string
		units int
		keys  []string
	}{
		{name: "one key", units: 1, keys: []string{"k"}},
		{name: "a weighted lease counts its units", units: 3, keys: []string{"k"}},
		{name: "several keys at once, one of them raised", units: 1, keys: []string{"k", "m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				var raised atomic.Int64 // "k"'s limit, in leases of tc.units
				raised.Store(2)
				limit := func(k string) int {
					if k == "k" {
						return int(raised.Load()) * tc.units
					}
					return 10 * tc.units
				}
				ms := memstore.New()
				r := NewWithKeys(ms, 0, Keys[string]{Limit: limit}, WithBreaker(1, time.Hour), WithLogger(quiet()))
				defer r.Close()

				held := map[string]int{} // units held per key, as the admissions told
				acquire := func(what string) *slots.Slot {
					s, err := r.TryAcquireAllN(tc.units, tc.keys...)
					if err != nil {
						return nil
					}
					for _, k := range tc.keys {
						held[k] += tc.units
						assert.LessOrEqual(t, held[k], limit(k), "%s: %s over its limit", what, k)
					}
					return s
				}
				release := func(s *slots.Slot) {
					s.Release()
					for _, k := range tc.keys {
						held[k] -= tc.units
					}
				}

				var inStore []*slots.Slot
				for range 2 {
					s := acquire("in the store")
					require.NotNil(t, s)
					inStore = append(inStore, s)
				}
				raised.Store(3)
				unmirrored := acquire("in the store, under the raised limit")
				require.NotNil(t, unmirrored, "the store admits under the raised limit")
				require.False(t, unmirrored.Degraded())
				require.Equal(t, 2*tc.units, r.Local().InFlight("k"), "the local registry, on the old limit, has no room for it")

				time.Sleep(LocalLimitRefresh + time.Millisecond) // the local limit is refreshed at its next admission
				ms.Kill()
				for try := range 3 {
					if s := acquire("admitted while the store is down"); s != nil {
						defer release(s)
						require.True(t, s.Degraded())
					}
					require.True(t, r.Stats().BreakerOpen, "try %d", try)
					assert.Equal(t, 3*tc.units, r.Local().Limit("k"), "the local limit has caught up")
				}

				release(unmirrored)
				s := acquire("admitted while the store is down, in the room of the lease released")
				require.NotNil(t, s, "the room of the lease held without a mirror is free once it is released")
				assert.True(t, s.Degraded())
				release(s)
				for _, s := range inStore {
					release(s)
				}
				unmirroredIs(t, r, 0)
			})
		})
	}
}

// unmirroredIs checks that r counts n units held without a local slot,
// on every key.
func unmirroredIs(t *testing.T, r *Registry[string], n int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	for _, u := range r.held.unmirrored {
		total += u
	}
	assert.Equal(t, n, total, "units held without a local slot")
}

// A lease held without a local slot stops counting however it ends: a
// Release after Close, or the Release that follows an Observer's panic
// on its admission (which never reaches its caller).
func TestFallbackCountEndsWithTheLease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		panics bool // the Observer panics on the admission
	}{
		{name: "released after Close"},
		{name: "released by the panic of an Observer", panics: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				var limit atomic.Int64
				limit.Store(2)
				var boom atomic.Bool
				obs := slots.ObserverFunc(func(e slots.Event) {
					if e.Kind == slots.EventAcquired && boom.Load() {
						panic("boom")
					}
				})
				ms := memstore.New()
				r := NewWithKeys(ms, 0, Keys[string]{Limit: func(string) int { return int(limit.Load()) }},
					WithBreaker(1, time.Hour), WithLogger(quiet()), WithObserver(obs))
				defer r.Close()
				first, err := r.TryAcquireN("k", 2)
				require.NoError(t, err)
				defer first.Release()
				limit.Store(4)
				// The store admits it; the local registry, on 2, has no room.
				if tc.panics {
					boom.Store(true)
					assert.PanicsWithValue(t, "boom", func() { _, _ = r.TryAcquireN("k", 2) })
				} else {
					s, err := r.TryAcquireN("k", 2)
					require.NoError(t, err)
					unmirroredIs(t, r, 2)
					r.Close()
					s.Release()
				}
				unmirroredIs(t, r, 0)
			})
		})
	}
}

// Admissions made at the same time while the store is down count one
// another and the lease held without a local slot: never more than the
// limit held at once.
func TestFallbackCountHoldsUnderConcurrentAdmissions(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var limit atomic.Int64
		limit.Store(2)
		ms := memstore.New()
		r := NewWithKeys(ms, 0, Keys[string]{Limit: func(string) int { return int(limit.Load()) }},
			WithBreaker(1, time.Hour), WithLogger(quiet()))
		defer r.Close()
		var inStore []*slots.Slot
		for range 2 {
			s, err := r.TryAcquire("k")
			require.NoError(t, err)
			inStore = append(inStore, s)
		}
		limit.Store(4)
		unmirrored, err := r.TryAcquire("k")
		require.NoError(t, err)
		unmirroredIs(t, r, 1)
		time.Sleep(LocalLimitRefresh + time.Millisecond)
		ms.Kill()
		inStore[0].Release() // room for 2 under the local registry, 1 with the lease held without a slot

		var held, most, admitted atomic.Int64
		held.Store(2) // inStore[1] and unmirrored
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 50 {
					s, err := r.TryAcquire("k")
					if err != nil {
						runtime.Gosched()
						continue
					}
					n := held.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					admitted.Add(1)
					runtime.Gosched()
					held.Add(-1)
					s.Release()
				}
			})
		}
		wg.Wait()
		assert.LessOrEqual(t, most.Load(), int64(4), "held at once, with the lease held without a local slot")
		assert.Positive(t, admitted.Load(), "the room left was used")
		unmirrored.Release()
		inStore[1].Release()
		unmirroredIs(t, r, 0)
	})
}
