package fleet

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/redistest"
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
	r := New[string](c, "mem", 1)
	t.Cleanup(r.Close)
	const n = 50_000
	drained := func() bool {
		keys, err := c.DBSize(context.Background()).Result()
		return err == nil && r.Stats().RemovalsPending == 0 && keys <= 1 // the epoch key stays
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
	after := heapAfterGC()
	t.Logf("heap: %.2f MiB before the burst, %.2f MiB after it", float64(before)/(1<<20), float64(after)/(1<<20))
	assert.Less(t, after, before+512<<10, "within 512 KiB of where it was")
	assert.Zero(t, r.Stats().Held)
}
