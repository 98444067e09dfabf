package registry_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sync/semaphore"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

const (
	benchKeys  = 1000 // distinct keys walked by the single-key benchmarks
	benchLimit = 8    // per-key limit (per-model limit in the multi-key benchmark)

	benchProviderLimit = 64 // per-provider limit in the multi-key benchmark
	benchModels        = 10 // models under the provider in the multi-key benchmark
)

// benchKeyList returns benchKeys distinct keys shaped like a gateway's
// tenant/model keys, built up front so that formatting is not measured.
func benchKeyList() []string {
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("org-%d/model-%d", i/10, i%10)
	}
	return keys
}

// mutexMap is the baseline: what a gateway writes by hand today for a limit
// per key. One mutex guards a map from key to a weighted semaphore; refs
// counts the callers that hold the semaphore or are about to try it, so that
// the entry is deleted only when nobody can still touch it, and the map never
// keeps idle keys (as the registry does not either).
//
// It is written to be a fair, competent baseline: the semaphore is tried
// outside the map lock, so the lock is held only for the map operation; the
// handle is the *mmEntry itself and the caller keeps the key, so acquiring
// allocates nothing beyond a new key's entry and semaphore (no closure, no
// handle object). What it does not do is what the registry adds: lock
// sharding, FIFO across TryAcquire and waiters, double-release protection,
// stats and RetryAfter.
type mutexMap struct {
	limit int64

	mu sync.Mutex
	m  map[string]*mmEntry
}

type mmEntry struct {
	sem  *semaphore.Weighted
	refs int // guarded by mutexMap.mu
}

func newMutexMap(limit int64) *mutexMap {
	return &mutexMap{limit: limit, m: make(map[string]*mmEntry)}
}

// ref returns key's entry, creating it if needed, and counts the caller in
// it, so the entry outlives the caller's use of its semaphore.
func (g *mutexMap) ref(key string) *mmEntry {
	g.mu.Lock()
	e := g.m[key]
	if e == nil {
		e = &mmEntry{sem: semaphore.NewWeighted(g.limit)}
		g.m[key] = e
	}
	e.refs++
	g.mu.Unlock()
	return e
}

// unref drops the caller's count and deletes the entry once nobody holds or
// is about to try its semaphore. A later caller then creates a fresh one.
func (g *mutexMap) unref(key string, e *mmEntry) {
	g.mu.Lock()
	e.refs--
	if e.refs == 0 {
		delete(g.m, key)
	}
	g.mu.Unlock()
}

// tryAcquire takes a unit of key's capacity without waiting, or returns nil.
func (g *mutexMap) tryAcquire(key string) *mmEntry {
	e := g.ref(key)
	if e.sem.TryAcquire(1) {
		return e
	}
	g.unref(key, e)
	return nil
}

// acquire takes a unit of key's capacity, waiting while it is full.
func (g *mutexMap) acquire(ctx context.Context, key string) (*mmEntry, error) {
	e := g.ref(key)
	if err := e.sem.Acquire(ctx, 1); err != nil {
		g.unref(key, e)
		return nil, err
	}
	return e, nil
}

// release gives back what tryAcquire or acquire returned for key.
func (g *mutexMap) release(key string, e *mmEntry) {
	e.sem.Release(1)
	g.unref(key, e)
}

// BenchmarkRegistryTryAcquireRelease: one goroutine walks 1000 keys, one
// TryAcquire and Release per operation. Each key goes idle at once, so every
// operation also creates and removes the key's state: the cost a gateway pays
// per request when its tenants are many and each has little in flight.
func BenchmarkRegistryTryAcquireRelease(b *testing.B) {
	keys := benchKeyList()

	run := func(reg *registry.Registry[string]) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s, err := reg.TryAcquire(keys[i%benchKeys])
				if err != nil {
					b.Fatal(err)
				}
				s.Release()
				i++
			}
		}
	}
	b.Run("inflight", run(registry.New[string](benchLimit)))
	// The same with leak detection: a tracked hold and a cleanup per slot.
	b.Run("inflight-leakcheck", run(registry.New[string](benchLimit, slots.WithLeakDetection())))
	// Weighted: 3 units of each key's 3*benchLimit.
	b.Run("inflight-units", func(b *testing.B) {
		reg := registry.New[string](3 * benchLimit)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			s, err := reg.TryAcquireN(keys[i%benchKeys], 3)
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
			i++
		}
	})

	b.Run("mutexmap", func(b *testing.B) {
		g := newMutexMap(benchLimit)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := keys[i%benchKeys]
			e := g.tryAcquire(k)
			if e == nil {
				b.Fatal("key full")
			}
			g.release(k, e)
			i++
		}
	})
}

// BenchmarkRegistryTryAcquireReleaseParallel is the same on every core: each
// goroutine walks the keys from its own offset, so goroutines mostly touch
// different keys at a time. The registry's shard locks compete with the
// baseline's single map lock.
func BenchmarkRegistryTryAcquireReleaseParallel(b *testing.B) {
	keys := benchKeyList()

	// startOffset spreads the goroutines' starting keys apart. The step is
	// prime to benchKeys, so goroutines never start on the same key.
	startOffset := func(next *atomic.Int64) int {
		return int(next.Add(1)*397) % benchKeys
	}

	b.Run("inflight", func(b *testing.B) {
		reg := registry.New[string](benchLimit)
		var next atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := startOffset(&next)
			for pb.Next() {
				s, err := reg.TryAcquire(keys[i%benchKeys])
				if err != nil {
					b.Error(err)
					return
				}
				s.Release()
				i++
			}
		})
	})

	b.Run("mutexmap", func(b *testing.B) {
		g := newMutexMap(benchLimit)
		var next atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := startOffset(&next)
			for pb.Next() {
				k := keys[i%benchKeys]
				e := g.tryAcquire(k)
				if e == nil {
					b.Error("key full")
					return
				}
				g.release(k, e)
				i++
			}
		})
	})
}

// BenchmarkRegistryAcquireAll measures admission under two keys at once, a
// provider cap and a model cap, on one goroutine: the fixed cost of the
// multi-key path when nothing waits. The provider stays the same and the
// model cycles through benchModels, so both keys go idle after each release.
func BenchmarkRegistryAcquireAll(b *testing.B) {
	ctx := context.Background()
	const provider = "provider-a"
	models := make([]string, benchModels)
	for i := range models {
		models[i] = fmt.Sprintf("%s/model-%d", provider, i)
	}

	b.Run("inflight", func(b *testing.B) {
		reg := registry.New[string](benchLimit)
		reg.SetLimit(provider, benchProviderLimit)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			s, err := reg.AcquireAll(ctx, provider, models[i%benchModels])
			if err != nil {
				b.Fatal(err)
			}
			s.Release()
			i++
		}
	})

	// The baseline is what a gateway writes by hand: one mutexMap per
	// dimension, the provider's semaphore taken first and the model's
	// second. A fixed order keeps two such callers from deadlocking; the
	// price, which the registry does not pay, is that a caller waiting for
	// its model sits on a provider slot meanwhile. Nothing waits here, so
	// the comparison is of the uncontended cost only.
	b.Run("mutexmap", func(b *testing.B) {
		providers := newMutexMap(benchProviderLimit)
		perModel := newMutexMap(benchLimit)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			model := models[i%benchModels]
			pe, err := providers.acquire(ctx, provider)
			if err != nil {
				b.Fatal(err)
			}
			me, err := perModel.acquire(ctx, model)
			if err != nil {
				providers.release(provider, pe)
				b.Fatal(err)
			}
			perModel.release(model, me)
			providers.release(provider, pe)
			i++
		}
	})
}
