package fleet

import (
	"fmt"
	"testing"
)

// BenchmarkOutageDrain: a burst of n waiters lined up under the local
// registry's queue bound (the store unreachable) drains, one admitted at
// a time; each admission lets the next try, which finds the key full
// again and is told so (blockedOn). The time per waiter (ns/waiter) must
// stay flat as n grows: telling a waiter the key is full must not look at
// every waiter after it. It did when blockedOn first
// woke the waiters behind it with no place yet: 589 ns a waiter at 1,000
// and 6,796 at 10,000, where now 193, 281 and 205 at 100,000.
func BenchmarkOutageDrain(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				r := &Registry[string]{}
				r.maxQueue, r.maxFlowQueue = -1, -1 // lineUp counts the queue: unbounded while they line up
				ws := make([]*waiter, n)
				for i := range ws {
					ws[i] = &waiter{keys: []string{"k"}, wake: make(chan struct{}, 1)}
					if err := r.enqueue(ws[i]); err != nil {
						b.Fatal(err)
					}
				}
				// The first is told the key is full; the rest line up behind it.
				r.blockedOn(ws[0], "k", true)
				for _, w := range ws[1:] {
					if ok, held := r.mayTry(w); ok || held != 0 {
						b.Fatalf("mayTry: %v, %d", ok, held)
					}
					if i, _ := r.lineUp(w, 0); i != -1 {
						b.Fatalf("lineUp refused %d", i)
					}
				}
				r.maxQueue = n
				b.StartTimer()
				// A release at a time: the first is admitted, the next tries
				// and finds the key full again.
				for i, w := range ws {
					r.dequeue(w)
					if i+1 < n {
						next := ws[i+1]
						<-next.wake
						if ok, _ := r.mayTry(next); !ok {
							b.Fatal("the next waiter may not try")
						}
						r.expect(next, "")
						r.blockedOn(next, "k", true)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/waiter")
		})
	}
}
