package core_test

import (
	"fmt"
	"testing"

	"github.com/inflight-go/inflight/internal/core"
)

// BenchmarkQueueNext measures one grant and one arrival on a lane with many
// flows queued: pick the next waiter, serve it, queue it again. The cost
// must not grow with the number of flows (no scan over them; with waiters
// of several units, a turn's worth looks at the first 64 flows at most).
func BenchmarkQueueNext(b *testing.B) {
	for _, units := range []int{1, 4} {
		for _, flows := range []int{1, 10, 1000, 100000} {
			if units > 1 && flows == 1 {
				continue
			}
			b.Run(fmt.Sprintf("units=%d/flows=%d", units, flows), func(b *testing.B) {
				ln := core.Lane{Limit: units}
				for i := range flows {
					for range 2 { // flow i's waiters weigh 1 + i%units
						ln.Waiters.Push(&heavyWaiter(fmt.Sprint("org-", i), 1, 1+i%units).Elem)
					}
				}
				if flows == 1 { // the plain FIFO path: one class, one flow
					ln = core.Lane{Limit: 1}
					for range 2 {
						ln.Waiters.Push(&waiter(core.ClassDefault, "", 0).Elem)
					}
				}
				b.ResetTimer()
				for b.Loop() {
					w, passed := ln.Candidate(nil)
					ln.Serve(w)
					passed.Pass(w, 1)
					ln.Waiters.Push(&w.Elem)
				}
			})
		}
	}
}
