package core_test

import (
	"fmt"
	"testing"

	"github.com/inflight-go/inflight/internal/core"
)

// BenchmarkQueueNext measures one grant and one arrival on a lane with many
// flows queued: pick the next waiter, serve it, queue it again. The cost
// must not grow with the number of flows (no scan over them).
func BenchmarkQueueNext(b *testing.B) {
	for _, flows := range []int{1, 10, 1000, 100000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			ln := core.Lane{Limit: 1}
			for i := range flows {
				for range 2 {
					ln.Waiters.Push(&waiter(core.ClassDefault, fmt.Sprint("org-", i), 1).Elem)
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
				w := ln.Candidate(nil)
				ln.Serve(w)
				ln.Waiters.Push(&w.Elem)
			}
		})
	}
}
