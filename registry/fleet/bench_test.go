package fleet

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// BenchmarkFleetAcquireRelease measures TryAcquireAll + Release against a
// real redis-server on loopback (client and server on one machine), with 1,
// 16 and 64 callers and one or two levels of keys. Each op is one script
// call; the removals, batched in the background, are waited for before the
// clock stops, so ops/s counts them. It reports the p99 of the acquire call.
func BenchmarkFleetAcquireRelease(b *testing.B) {
	srv := redistest.Start(b)
	for _, levels := range []int{1, 2} {
		for _, callers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("levels=%d/callers=%d", levels, callers), func(b *testing.B) {
				r := New[string](redisstore.New(srv.Client(), fmt.Sprint("bench-", levels, "-", callers)), 1<<30)
				defer r.Close()
				keys := []string{"zai", "zai/glm-5"}[:levels]
				var mu sync.Mutex
				var lat []time.Duration
				one := func(local []time.Duration) []time.Duration {
					t0 := time.Now()
					s, err := r.TryAcquireAll(keys...)
					local = append(local, time.Since(t0))
					if err != nil {
						b.Error(err)
						return local
					}
					s.Release()
					return local
				}
				b.ResetTimer()
				if callers == 1 {
					for b.Loop() {
						lat = one(lat)
					}
				} else {
					b.SetParallelism(callers / runtime.GOMAXPROCS(0))
					b.RunParallel(func(pb *testing.PB) {
						local := make([]time.Duration, 0, 1024)
						for pb.Next() {
							local = one(local)
						}
						mu.Lock()
						lat = append(lat, local...)
						mu.Unlock()
					})
				}
				for { // the removals are part of the work
					n, err := r.InFlight(context.Background(), keys[0])
					if err != nil || n == 0 {
						break
					}
					runtime.Gosched()
				}
				b.StopTimer()
				slices.Sort(lat)
				if len(lat) > 0 {
					b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
			})
		}
	}
}
