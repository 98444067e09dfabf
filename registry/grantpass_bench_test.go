package registry

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/inflight-go/inflight/internal/core"
)

// BenchmarkGrantPassBesideHeavyWaiter times one grant pass over keys "a"
// and "b" that serves nobody: a waiter for "a" alone, weighing 3 units
// where 2 are free, keeps its place at the head of "a", and q waiters for
// both keys queue behind it while "b" has room. Each of them asks "a"
// whether its turn has come (canTake), so the pass's cost is what a
// release or a withdrawal on those keys pays while a heavy waiter waits.
func BenchmarkGrantPassBesideHeavyWaiter(b *testing.B) {
	for _, q := range []int{25, 100, 400} {
		b.Run(fmt.Sprintf("waiters=%d", q), func(b *testing.B) {
			r := New[string](1000)
			r.SetLimit("a", 4)
			held, err := r.TryAcquireN("a", 2)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{}, q+1)
			wait := func(f func() error) {
				go func() {
					if err := f(); err == nil {
						b.Error("a waiter was served")
					}
					done <- struct{}{}
				}()
			}
			wait(func() error { _, err := r.AcquireN(ctx, "a", 3); return err })
			for r.Waiting("a") < 1 {
				runtime.Gosched()
			}
			for range q {
				wait(func() error { _, err := r.AcquireAll(ctx, "a", "b"); return err })
			}
			for r.Waiting("a") < q+1 {
				runtime.Gosched()
			}
			ea, eb := r.entryOf("a"), r.entryOf("b")
			b.ResetTimer()
			for b.Loop() {
				var wk core.Wakes
				r.multiMu.Lock()
				set, serve := r.lockForGrant([]*entry[string]{ea, eb}, nil)
				r.grantLocked(serve, &wk)
				r.unlockShards(set)
				r.multiMu.Unlock()
				wk.Wake()
			}
			b.StopTimer()
			cancel()
			for range q + 1 {
				<-done
			}
			held.Release()
		})
	}
}

// entryOf returns key's entry; it must be live (held or waited for).
func (r *Registry[K]) entryOf(key K) *entry[K] {
	sh, h := r.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.lanes.get(key, h)
}
