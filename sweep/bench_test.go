package sweep_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
)

// BenchmarkAcquireDuringSweep measures what a sweep costs the admission
// path: TryAcquire+Release over 1000 keys on a registry that holds 100k
// slots besides, with a sweep of all 100k running back to back on another
// goroutine, next to the same with no sweep. A sweep locks one shard at a
// time, so an admission waits at most for one shard's copy.
func BenchmarkAcquireDuringSweep(b *testing.B) {
	const held, heldKeys, hot = 100_000, 10_000, 1000
	reg := registry.New[string](slots.Unlimited)
	var holders []*slots.Slot
	for i := range held {
		s, err := reg.TryAcquire(fmt.Sprintf("tenant-%d/model", i%heldKeys))
		if err != nil {
			b.Fatal(err)
		}
		holders = append(holders, s)
	}
	defer func() {
		for _, s := range holders {
			s.Release()
		}
	}()
	keys := make([]string, hot)
	for i := range keys {
		keys[i] = fmt.Sprintf("hot-%d/model", i)
	}
	m := sweep.New(reg, sweep.WithInterval(time.Hour))
	defer m.Stop()

	run := func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			s, err := reg.TryAcquire(keys[i%hot])
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
			i++
		}
	}
	b.Run("no-sweep", run)
	b.Run("sweeping", func(b *testing.B) {
		var stop atomic.Bool
		var sweeps atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() {
			for !stop.Load() {
				if rep := m.Sweep(time.Now()); rep.InUse < held {
					b.Errorf("a sweep saw %d holders", rep.InUse)
					return
				}
				sweeps.Add(1)
			}
		})
		run(b)
		stop.Store(true)
		wg.Wait()
		b.ReportMetric(float64(sweeps.Load()), "sweeps")
	})
}

// BenchmarkSweep100k is one sweep of a registry holding 100k slots over 10k
// keys.
func BenchmarkSweep100k(b *testing.B) {
	const held, heldKeys = 100_000, 10_000
	reg := registry.New[string](slots.Unlimited)
	var holders []*slots.Slot
	for i := range held {
		s, _ := reg.TryAcquire(fmt.Sprintf("tenant-%d/model", i%heldKeys))
		holders = append(holders, s)
	}
	m := sweep.New(reg, sweep.WithInterval(time.Hour))
	defer m.Stop()
	b.ReportAllocs()
	for b.Loop() {
		m.Sweep(time.Now())
	}
	for _, s := range holders {
		s.Release()
	}
}

// BenchmarkHandler serves ?limit=1 and the default limit over a registry of
// 1,000,000 holders on 10,000 keys.
func BenchmarkHandler(b *testing.B) {
	const held, keys = 1_000_000, 10_000
	reg := registry.New[string](slots.Unlimited)
	holders := make([]*slots.Slot, 0, held)
	for i := range held {
		s, err := reg.TryAcquire(fmt.Sprintf("tenant-%d/model", i%keys))
		if err != nil {
			b.Fatal(err)
		}
		holders = append(holders, s)
	}
	defer func() {
		for _, s := range holders {
			s.Release()
		}
	}()
	h := sweep.Handler(reg)
	for _, q := range []string{"limit=1", "limit=1000"} {
		b.Run(q, func(b *testing.B) {
			b.ReportAllocs()
			req := httptest.NewRequest(http.MethodGet, "/debug/slots?"+q, nil)
			for b.Loop() {
				h.ServeHTTP(httptest.NewRecorder(), req)
			}
		})
	}
}
