package fleet

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// After a burst of holders, memory follows the live holders: the record of
// held leases shrinks with them.
func TestMemoryFollowsHoldersAfterABurst(t *testing.T) {
	if testing.Short() {
		t.Skip("a burst of 50,000 leases")
	}
	srv := redistest.Start(t) // a server of its own, so that the heap is this process's alone
	c := srv.Client()
	r := New[string](redisstore.New(c, "mem"), 1)
	t.Cleanup(r.Close)
	const n = 50_000
	drained := func() bool {
		keys, err := c.DBSize(context.Background()).Result()
		return err == nil && r.Stats().RemovalsPending == 0 && keys <= 2 // the epoch and heard keys stay
	}
	burst := func(n int) {
		held := make([]*slots.Slot, 0, n)
		for i := range n {
			s, err := r.TryAcquire(fmt.Sprint("k", i))
			require.NoError(t, err)
			held = append(held, s)
		}
		for _, s := range held {
			s.Release()
		}
		eventually(t, "every lease is removed", drained)
	}
	// A first burst fills the local registry's bounded cache of idle key
	// records (a few hundred KiB at most), which is kept.
	burst(5000)
	before := heapAfterGC()
	burst(n)
	// Goroutines of the tests before this one may still be winding down
	// (closing clients, a last renewal) and allocating meanwhile: what this
	// burst kept is in every reading, their garbage goes by a later one.
	after := heapAfterGC()
	assert.Eventually(t, func() bool {
		after = min(after, heapAfterGC())
		return after < before+512<<10
	}, 5*time.Second, 20*time.Millisecond, "within 512 KiB of where it was")
	t.Logf("heap: %.2f MiB before the burst, %.2f MiB after it", float64(before)/(1<<20), float64(after)/(1<<20))
	assert.Zero(t, r.Stats().Held)
}

// SetLimit and ClearLimit of many keys keep no memory once cleared: the
// map of overrides is made anew when it has shrunk. The local registry
// gets the same calls; what it keeps is its own, measured alone first.
func TestMemoryOfClearedLimits(t *testing.T) {
	m := newMini(t)
	r := m.registry(1)
	alone := registry.New[string](1)
	const n = 100_000
	kept := func(set func(string, int), clear func(string)) uint64 {
		set("warm", 2)
		clear("warm")
		before := heapAfterGC()
		for i := range n {
			set(fmt.Sprint("k", i), 2)
		}
		for i := range n {
			clear(fmt.Sprint("k", i))
		}
		return max(heapAfterGC(), before) - before
	}
	local := kept(alone.SetLimit, alone.ClearLimit)
	fleet := kept(r.SetLimit, r.ClearLimit)
	runtime.KeepAlive(alone)
	t.Logf("kept after %d limits set and cleared: %.2f MiB by a registry alone, %.2f MiB by a fleet registry with its local one",
		n, float64(local)/(1<<20), float64(fleet)/(1<<20))
	assert.Less(t, fleet, local+512<<10, "the fleet keeps within 512 KiB of what its local registry keeps")
	assert.Equal(t, 1, r.Limit("k7"))
}

// A burst of waiters takes time in proportion to its size, and leaves no
// memory behind; so does a burst of acquire calls queued for pipelines
// (slices.Delete keeps a slice's capacity). The waiters wait on one key
// together, or each on its own; a few leave midway (their context ended),
// the rest in order, as they are admitted.
func TestMemoryOfQueuesAfterABurst(t *testing.T) {
	t.Run("waiters", func(t *testing.T) {
		const n = 100_000
		for _, keys := range []int{1, n} {
			r := &Registry[string]{}
			before := heapAfterGC()
			start := time.Now()
			ws := make([]*waiter, n)
			for i := range ws {
				ws[i] = &waiter{keys: []string{fmt.Sprint("k", i%keys)}, wake: make(chan struct{}, 1)}
				require.NoError(t, r.enqueue(ws[i]))
			}
			for i, w := range ws {
				if i%64 == 63 {
					r.dequeue(w)
				}
			}
			for _, w := range ws {
				r.dequeue(w)
			}
			took := time.Since(start)
			ws = nil
			after := heapAfterGC()
			t.Logf("%d waiters on %d keys: %v; heap %.2f MiB before, %.2f MiB after", n, keys, took.Round(time.Millisecond),
				float64(before)/(1<<20), float64(after)/(1<<20))
			assert.Less(t, took, 10*time.Second, "a burst of waiters on %d keys", keys)
			assert.Less(t, after, before+256<<10, "within 256 KiB of where it was (%d keys)", keys)
			runtime.KeepAlive(r)
		}
	})
	t.Run("calls", func(t *testing.T) {
		const n = 10_000
		for _, cancelled := range []bool{false, true} {
			q := &calls{max: maxSending}
			cs := make([]*scriptCall, n)
			for i := range cs {
				cs[i] = &scriptCall{}
				q.pending = append(q.pending, cs[i])
			}
			if cancelled {
				for _, c := range cs {
					q.giveUp(c, context.Canceled)
				}
			} else {
				for b, _ := q.takeLocked(); b != nil; b, _ = q.takeLocked() {
				}
			}
			assert.Empty(t, q.pending)
			assert.Less(t, cap(q.pending), minRemade, "the array of %d calls is let go (cancelled: %v)", n, cancelled)
		}
	})
}
