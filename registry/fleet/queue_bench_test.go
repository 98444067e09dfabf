package fleet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// fwCallCounter is a client hook that counts the commands a client sends
// and the round trips they take (a pipeline is one round trip).
type fwCallCounter struct{ cmds, trips atomic.Int64 }

func (h *fwCallCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *fwCallCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}
func (h *fwCallCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

// fwCounted returns a client of srv whose calls h counts.
func fwCounted(b *testing.B, srv *redistest.Server, h *fwCallCounter) *redis.Client {
	c := srv.Client()
	c.AddHook(h)
	return c
}

// fwDrained waits until Redis counts no holder on key: the removals of
// released leases, sent in the background, are part of the work.
func fwDrained(b *testing.B, r *Registry[string], key string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := r.InFlight(context.Background(), key)
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s still held (%d, %v) 10s after the last release", key, n, err)
		}
		time.Sleep(100 * time.Microsecond) // polling a condition
	}
}

// BenchmarkFleetUncontendedAdmission measures one TryAcquire + Release on
// a key with room, against a real redis-server on loopback: the p50 and
// p99 of the pair (Release only queues the removal), and the commands and
// round trips each admission costs (the removals and the heartbeat
// included).
func BenchmarkFleetUncontendedAdmission(b *testing.B) {
	srv := redistest.Start(b)
	h := &fwCallCounter{}
	r := New[string](redisstore.New(fwCounted(b, srv, h), "fw-bench-free"), 1<<20)
	defer r.Close()
	lat := make([]time.Duration, 0, 1<<16)
	cmds0, trips0 := h.cmds.Load(), h.trips.Load()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		s, err := r.TryAcquire("k")
		if err != nil {
			b.Fatal(err)
		}
		s.Release()
		lat = append(lat, time.Since(t0))
	}
	fwDrained(b, r, "k")
	b.StopTimer()
	b.ReportMetric(float64(fwPct(lat, 50))/float64(time.Microsecond), "p50-µs")
	b.ReportMetric(float64(fwPct(lat, 99))/float64(time.Microsecond), "p99-µs")
	b.ReportMetric(float64(h.cmds.Load()-cmds0)/float64(b.N), "redis-cmds/op")
	b.ReportMetric(float64(h.trips.Load()-trips0)/float64(b.N), "round-trips/op")
}

// BenchmarkFleetContended16 measures Acquire + Release (no hold) by 16
// goroutines on one key capped at 8, from one Registry and spread over
// four (four processes of the fleet): admissions per second, the p50 and
// p99 of Acquire, and the commands and round trips each admission costs,
// summed over every Registry's client (waits, removals, heartbeats).
func BenchmarkFleetContended16(b *testing.B) {
	const goroutines, limit = 16, 8
	srv := redistest.Start(b)
	for _, procs := range []int{1, 4} {
		b.Run(fmt.Sprintf("registries=%d", procs), func(b *testing.B) {
			h := &fwCallCounter{}
			rs := make([]*Registry[string], procs)
			for i := range rs {
				rs[i] = New[string](redisstore.New(fwCounted(b, srv, h), fmt.Sprint("fw-bench-16-", procs)), limit)
				defer rs[i].Close()
			}
			var left atomic.Int64
			left.Store(int64(b.N))
			var mu sync.Mutex
			var lat []time.Duration
			var wg sync.WaitGroup
			cmds0, trips0 := h.cmds.Load(), h.trips.Load()
			b.ResetTimer()
			for g := range goroutines {
				r := rs[g%procs]
				wg.Add(1)
				go func() {
					defer wg.Done()
					local := make([]time.Duration, 0, 1024)
					for left.Add(-1) >= 0 {
						t0 := time.Now()
						s, err := r.Acquire(context.Background(), "k")
						if err != nil {
							b.Error(err)
							return
						}
						local = append(local, time.Since(t0))
						s.Release()
					}
					mu.Lock()
					lat = append(lat, local...)
					mu.Unlock()
				}()
			}
			wg.Wait()
			fwDrained(b, rs[0], "k")
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "admissions/s")
			b.ReportMetric(float64(fwPct(lat, 50))/float64(time.Microsecond), "acquire-p50-µs")
			b.ReportMetric(float64(fwPct(lat, 99))/float64(time.Microsecond), "acquire-p99-µs")
			b.ReportMetric(float64(h.cmds.Load()-cmds0)/float64(b.N), "redis-cmds/op")
			b.ReportMetric(float64(h.trips.Load()-trips0)/float64(b.N), "round-trips/op")
		})
	}
}
