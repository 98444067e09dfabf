package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

func TestRegistryProbe(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		peak  int
	}{
		{"limit of two: two hold while three wait", 2, 2},
		{"unlimited: all five hold", slots.Unlimited, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				reg := registry.New[string](tc.limit)
				var cur, peak atomic.Int64
				release := make(chan struct{})
				var wg sync.WaitGroup
				for range 5 {
					wg.Go(func() {
						s, err := reg.Acquire(context.Background(), "upstream")
						if !assert.NoError(t, err) {
							return
						}
						// A CAS loop: a Load and a Store apart could let
						// a lower count overwrite a higher one.
						for n := cur.Add(1); ; {
							old := peak.Load()
							if n <= old || peak.CompareAndSwap(old, n) {
								break
							}
						}
						<-release
						cur.Add(-1)
						s.Release()
					})
				}
				synctest.Wait()
				assert.Equal(t, int64(tc.peak), cur.Load())
				assert.Equal(t, tc.peak, reg.InFlight("upstream"))
				assert.Equal(t, 5-tc.peak, reg.Waiting("upstream"))
				close(release)
				wg.Wait()
				assert.Equal(t, int64(tc.peak), peak.Load())
				assert.Equal(t, 0, reg.Keys())
			})
		})
	}
}

func TestRegistryKeysAreIndependent(t *testing.T) {
	reg := registry.New[string](1)
	a, err := reg.TryAcquire("a")
	require.NoError(t, err)
	b, err := reg.TryAcquire("b")
	require.NoError(t, err, "a full key does not affect another")
	assert.Equal(t, 2, reg.Keys())

	_, err = reg.TryAcquire("a")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	a.Release()
	assert.Equal(t, 1, reg.Keys(), "an idle key is removed on release")
	assert.Equal(t, 1, reg.InFlight("b"), "without touching the others")

	a2, err := reg.TryAcquire("a")
	require.NoError(t, err, "an idle key restarts from zero")
	a2.Release()
	b.Release()
	assert.Equal(t, 0, reg.Keys())
}

func TestRegistryRejectionInsertsNothing(t *testing.T) {
	reg := registry.New[string](0)
	_, err := reg.TryAcquire("never-seen")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "never-seen", le.Key)
	assert.Equal(t, 0, le.Limit)
	assert.Equal(t, 0, reg.Keys())

	_, err = reg.TryAcquireAll("p", "m")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, 0, reg.Keys())

	reg2 := registry.New[string](1)
	reg2.SetLimit("m", 0)
	_, err = reg2.TryAcquireAll("p", "m")
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "m", le.Key, "the error names the full key")
	assert.Equal(t, 0, reg2.Keys(), "the free key was not charged either")
}

func TestRegistryHoldsPastAnyTimeout(t *testing.T) {
	mock := clock.NewMock()
	reg := registry.New[string](2, slots.WithClock(mock))
	held := make([]*slots.Slot, 2)
	for i := range held {
		s, err := reg.TryAcquire("org/model")
		require.NoError(t, err)
		held[i] = s
	}
	for _, at := range []time.Duration{601 * time.Second, 1001 * time.Second} {
		mock.Set(time.Unix(0, 0).Add(at))
		_, err := reg.TryAcquire("org/model")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "still capped after %v", at)
		assert.Equal(t, 1, reg.Keys())
	}
	held[0].Release()
	s, err := reg.TryAcquire("org/model")
	require.NoError(t, err, "one release admits exactly one more")
	_, err = reg.TryAcquire("org/model")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	s.Release()
	held[1].Release()
	assert.Equal(t, 0, reg.Keys())
}

func TestRegistryAcquireAll(t *testing.T) {
	t.Run("a model at its cap waits while other models get provider slots", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			reg := registry.New[string](slots.Unlimited)
			reg.SetLimit("provider", 5)
			reg.SetLimit("model-a", 2)
			var held []*slots.Slot
			for range 2 {
				s, err := reg.AcquireAll(context.Background(), "provider", "model-a")
				require.NoError(t, err)
				held = append(held, s)
			}
			third := make(chan *slots.Slot, 1)
			go func() {
				s, err := reg.AcquireAll(context.Background(), "provider", "model-a")
				if assert.NoError(t, err) {
					third <- s
				}
			}()
			synctest.Wait()
			assert.Equal(t, 1, reg.Waiting("model-a"))
			assert.Equal(t, 2, reg.InFlight("provider"), "the waiter holds no provider slot")

			for range 3 {
				s, err := reg.TryAcquireAll("provider", "model-b")
				require.NoError(t, err, "a sibling model is not blocked by the waiter")
				held = append(held, s)
			}
			assert.Equal(t, 5, reg.InFlight("provider"))
			_, err := reg.TryAcquireAll("provider", "model-c")
			assert.ErrorIs(t, err, slots.ErrLimitReached, "provider cap holds")

			held[2].Release() // a model-b slot: provider room, model-a still full
			synctest.Wait()
			assert.Len(t, third, 0)
			held[0].Release() // a model-a slot: now both have room
			synctest.Wait()
			s := <-third
			assert.Equal(t, 2, reg.InFlight("model-a"))
			assert.Equal(t, 4, reg.InFlight("provider"))
			s.Release()
			for _, h := range held {
				h.Release()
			}
			assert.Equal(t, 0, reg.Keys())
		})
	})
	t.Run("keys in any order never deadlock", func(t *testing.T) {
		reg := registry.New[string](1)
		keys := []string{"a", "b", "c"}
		var wg sync.WaitGroup
		var inA atomic.Int32
		for g := range 16 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 2))
				for range 100 {
					ks := append([]string(nil), keys...)
					rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
					s, err := reg.AcquireAll(context.Background(), ks[:2+rng.IntN(2)]...)
					if !assert.NoError(t, err) {
						return
					}
					if inA.Add(1) > 2 {
						t.Error("more than two holders of three keys of cap one, each taking two or more")
					}
					inA.Add(-1)
					s.Release()
				}
			})
		}
		wg.Wait()
		assert.Equal(t, 0, reg.Keys())
	})
	t.Run("duplicate keys count once; no keys is an error", func(t *testing.T) {
		reg := registry.New[string](1)
		s, err := reg.AcquireAll(context.Background(), "a", "a", "b", "a")
		require.NoError(t, err)
		assert.Equal(t, 1, reg.InFlight("a"))
		assert.Equal(t, 1, reg.InFlight("b"))
		s.Release()
		_, err = reg.AcquireAll(context.Background())
		assert.ErrorIs(t, err, registry.ErrNoKeys)
		_, err = reg.TryAcquireAll()
		assert.ErrorIs(t, err, registry.ErrNoKeys)
		assert.Equal(t, 0, reg.Keys())
	})
	t.Run("a cancelled multi-key waiter leaves nothing behind", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			reg := registry.New[string](1)
			held, _ := reg.TryAcquire("b")
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error)
			go func() {
				_, err := reg.AcquireAll(ctx, "a", "b")
				errc <- err
			}()
			synctest.Wait()
			assert.Equal(t, 2, reg.Keys(), "a waited-on key is tracked")
			assert.Equal(t, 0, reg.InFlight("a"))
			cancel()
			assert.ErrorIs(t, <-errc, context.Canceled)
			assert.Equal(t, 1, reg.Keys())
			held.Release()
			assert.Equal(t, 0, reg.Keys())
		})
	})
	t.Run("waiters of one key are served in order, multi-key or not", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			reg := registry.New[string](1)
			held, _ := reg.TryAcquire("p")
			var order []string
			var mu sync.Mutex
			done := make(chan *slots.Slot)
			for _, keys := range [][]string{{"p", "x"}, {"p"}, {"p", "y"}, {"p"}} {
				go func() {
					s, err := reg.AcquireAll(context.Background(), keys...)
					if assert.NoError(t, err) {
						mu.Lock()
						order = append(order, strings.Join(keys, "+"))
						mu.Unlock()
						done <- s
					}
				}()
				synctest.Wait()
			}
			held.Release()
			for range 4 {
				(<-done).Release()
			}
			assert.Equal(t, []string{"p+x", "p", "p+y", "p"}, order)
			assert.Equal(t, 0, reg.Keys())
		})
	})
}

func TestRegistrySetLimit(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var warned atomic.Int32
		reg := registry.New[string](1, slots.WithLogger(slog.New(countingHandler{&warned})))
		a, _ := reg.TryAcquire("k")
		got := make(chan *slots.Slot, 2)
		for range 2 {
			go func() {
				s, err := reg.Acquire(context.Background(), "k")
				if assert.NoError(t, err) {
					got <- s
				}
			}()
		}
		synctest.Wait()
		reg.SetLimit("k", 3)
		synctest.Wait()
		assert.Equal(t, 3, reg.InFlight("k"), "raising admits the waiters")
		reg.SetLimit("k", 1)
		assert.Equal(t, 3, reg.InFlight("k"), "lowering evicts nobody")
		a.Release()
		_, err := reg.TryAcquire("k")
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		(<-got).Release()
		(<-got).Release()
		assert.Equal(t, 0, reg.Keys())
		assert.Equal(t, 1, reg.Limit("k"), "an override outlives the idle key")
		reg.ClearLimit("k")
		assert.Equal(t, 1, reg.Limit("k"))

		reg.SetLimit("k", -5)
		assert.Equal(t, 1, reg.Limit("k"), "a negative limit is ignored")
		assert.Equal(t, int32(1), warned.Load(), "and logged")
	})
	t.Run("limit 0: Acquire waits until raised, or times out", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			reg := registry.New[string](0, slots.WithMaxWait(time.Minute))
			got := make(chan error, 1)
			go func() {
				s, err := reg.Acquire(context.Background(), "k")
				if err == nil {
					s.Release()
				}
				got <- err
			}()
			synctest.Wait()
			reg.SetLimit("k", 1)
			assert.NoError(t, <-got)
			reg.SetLimit("k", 0)
			start := time.Now()
			_, err := reg.Acquire(context.Background(), "k")
			assert.ErrorIs(t, err, slots.ErrWaitTimeout)
			assert.Equal(t, time.Minute, time.Since(start))
			assert.Equal(t, 0, reg.Keys())
		})
	})
}

func TestRegistryBadInput(t *testing.T) {
	t.Run("negative default panics with the package prefix", func(t *testing.T) {
		assert.PanicsWithValue(t, "registry: negative default limit -3", func() { registry.New[int](-3) })
	})
	t.Run("nil context", func(t *testing.T) {
		reg := registry.New[string](1)
		_, err := reg.Acquire(nil, "k") //nolint:staticcheck
		assert.ErrorIs(t, err, slots.ErrNilContext)
		_, err = reg.AcquireAll(nil, "k", "j") //nolint:staticcheck
		assert.ErrorIs(t, err, slots.ErrNilContext)
		assert.Equal(t, 0, reg.Keys())
	})
	t.Run("huge string keys are rejected and insert nothing", func(t *testing.T) {
		type orgID string
		reg := registry.New[orgID](1)
		huge := orgID(strings.Repeat("x", 1<<20))
		_, err := reg.TryAcquire(huge)
		assert.ErrorIs(t, err, registry.ErrInvalidKey)
		_, err = reg.AcquireAll(context.Background(), "ok", huge)
		assert.ErrorIs(t, err, registry.ErrInvalidKey)
		assert.Equal(t, 0, reg.Keys())
		assert.Equal(t, uint64(2), reg.Stats().InvalidKeys)

		unbounded := registry.New[string](1, registry.WithMaxKeyBytes(0))
		s, err := unbounded.TryAcquire(string(huge))
		require.NoError(t, err, "the bound can be lifted")
		s.Release()
	})
	t.Run("double release is a counted no-op", func(t *testing.T) {
		reg := registry.New[string](1)
		s, _ := reg.TryAcquire("k")
		assert.True(t, s.Release())
		assert.False(t, s.Release())
		assert.Equal(t, uint64(1), reg.Stats().DoubleReleases)
		a, err := reg.TryAcquire("k")
		require.NoError(t, err)
		_, err = reg.TryAcquire("k")
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		a.Release()
		m, _ := reg.TryAcquireAll("k", "j")
		assert.True(t, m.Release())
		assert.False(t, m.Release())
		assert.Equal(t, 0, reg.Keys())
	})
	t.Run("release from another goroutine", func(t *testing.T) {
		reg := registry.New[string](1)
		s, _ := reg.TryAcquire("k")
		done := make(chan bool)
		go func() { done <- s.Release() }()
		assert.True(t, <-done)
		assert.Equal(t, 0, reg.Keys())
	})
	t.Run("NewWithLimitFunc without a function or a refresh panics", func(t *testing.T) {
		fn := registry.LimitFunc[int](func(context.Context, int) (int, error) { return 1, nil })
		assert.PanicsWithValue(t, "registry: NewWithLimitFunc needs a LimitFunc",
			func() { registry.NewWithLimitFunc[string](1, nil, time.Minute) })
		assert.PanicsWithValue(t,
			"registry: NewWithLimitFunc needs a positive refresh interval, got 0s",
			func() { registry.NewWithLimitFunc(1, fn, 0) })
	})
}

func TestRegistryLimitFunc(t *testing.T) {
	mock := clock.NewMock()
	var calls atomic.Int32
	var fail atomic.Bool
	limits := map[string]int{"org-a": 2}
	fn := func(_ context.Context, org string) (int, error) {
		calls.Add(1)
		if fail.Load() {
			return 0, errors.New("database down")
		}
		if n, ok := limits[org]; ok {
			return n, nil
		}
		return 0, fmt.Errorf("no org %q", org)
	}
	reg := registry.NewWithLimitFunc[string](1, fn, time.Minute, slots.WithClock(mock), slots.WithLogger(quiet))

	a1, err := reg.TryAcquire("org-a")
	require.NoError(t, err)
	a2, err := reg.TryAcquire("org-a")
	require.NoError(t, err, "the resolved limit (2) applies, not the default (1)")
	_, err = reg.TryAcquire("org-a")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, int32(1), calls.Load(), "cached until the refresh is due")

	fail.Store(true)
	mock.Add(2 * time.Minute)
	_, err = reg.TryAcquire("org-a")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, 2, reg.Limit("org-a"), "a failed refresh keeps the last known limit")
	assert.Equal(t, int32(2), calls.Load())

	// An org never resolved gets the default, and it is not cached.
	b, err := reg.TryAcquire("org-b")
	require.NoError(t, err)
	_, err = reg.TryAcquire("org-b")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, int32(4), calls.Load(), "each acquire retries a key never resolved")

	fail.Store(false)
	limits["org-a"] = 3
	a3, err := reg.TryAcquire("org-a")
	require.NoError(t, err, "a successful refresh raises the live key")
	assert.Equal(t, 3, reg.Limit("org-a"))

	reg.SetLimit("org-a", 1)
	mock.Add(2 * time.Minute)
	_, err = reg.TryAcquire("org-a")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, 1, reg.Limit("org-a"), "SetLimit overrides the LimitFunc")
	for _, s := range []*slots.Slot{a1, a2, a3, b} {
		s.Release()
	}
	assert.Equal(t, 0, reg.Keys())
}

// TestRegistryStress: 64 goroutines x 50 iterations over a few keys with a
// limit of 8, mixing TryAcquire, Acquire with random cancellation, AcquireAll
// and SetLimit; independent counters check every key's cap.
func TestRegistryStress(t *testing.T) {
	for _, tc := range []struct {
		name              string
		goroutines, iters int
	}{
		{"64 goroutines x 50 iterations", 64, 50},
		{"long hammer", 32, 1500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.iters > 100 && testing.Short() {
				t.Skip("long hammer")
			}
			hammer(t, tc.goroutines, tc.iters)
		})
	}
}

func hammer(t *testing.T, goroutines, iters int) {
	const maxLimit = 8
	keys := []string{"provider", "model-a", "model-b", "org-1", "org-2"}
	reg := registry.New[string](maxLimit, registry.WithShards(4), slots.WithMaxWait(time.Millisecond))
	counters := make(map[string]*atomic.Int64)
	for _, k := range keys {
		counters[k] = new(atomic.Int64)
	}
	var admitted, rejected, attempts atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for range iters {
				attempts.Add(1)
				var ks []string
				var s *slots.Slot
				var err error
				switch op := rng.IntN(6); op {
				case 0:
					ks = []string{keys[rng.IntN(len(keys))]}
					s, err = reg.TryAcquire(ks[0])
				case 1:
					reg.SetLimit(keys[rng.IntN(len(keys))], 1+rng.IntN(maxLimit))
					ks = []string{keys[rng.IntN(len(keys))]}
					s, err = reg.TryAcquire(ks[0])
				case 2, 3:
					ks = []string{keys[rng.IntN(len(keys))]}
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(2) == 0 {
						go cancel()
					}
					s, err = reg.Acquire(ctx, ks[0])
					cancel()
				default:
					ks = []string{"provider", keys[1+rng.IntN(len(keys)-1)]}
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(3) == 0 {
						go cancel()
					}
					s, err = reg.AcquireAll(ctx, ks...)
					cancel()
				}
				if err != nil {
					var le *slots.LimitError
					if !errors.As(err, &le) && !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error: %v", err)
					}
					rejected.Add(1)
					continue
				}
				admitted.Add(1)
				for _, k := range ks {
					if n := counters[k].Add(1); n > maxLimit {
						t.Errorf("key %s: %d in flight, over %d", k, n, maxLimit)
					}
				}
				if rng.IntN(2) == 0 {
					runtime.Gosched()
				}
				for _, k := range ks {
					counters[k].Add(-1)
				}
				if !s.Release() {
					t.Error("first release reported false")
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, attempts.Load(), admitted.Load()+rejected.Load())
	assert.Positive(t, admitted.Load())
	st := reg.Stats()
	assert.Equal(t, 0, st.InFlight)
	assert.Equal(t, 0, st.Waiting)
	assert.Equal(t, 0, reg.Keys())
	assert.Equal(t, st.Acquired, st.Released)
}

// TestRegistryCancelRacingGrant races cancellation against the grant, for a
// single key and for a multi-key waiter.
func TestRegistryCancelRacingGrant(t *testing.T) {
	for _, keys := range [][]string{{"k"}, {"k", "j"}} {
		t.Run(strings.Join(keys, "+"), func(t *testing.T) {
			reg := registry.New[string](1)
			for range 1000 {
				held, err := reg.TryAcquire("k")
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(context.Background())
				res := make(chan error, 1)
				go func() {
					s, err := reg.AcquireAll(ctx, keys...)
					if err == nil {
						s.Release()
					}
					res <- err
				}()
				for reg.Waiting("k") == 0 && len(res) == 0 {
					runtime.Gosched()
				}
				released := make(chan struct{})
				go func() { held.Release(); close(released) }()
				cancel()
				<-released
				if err := <-res; err != nil {
					require.ErrorIs(t, err, context.Canceled)
				}
				require.Equal(t, 0, reg.Keys())
			}
		})
	}
}

// TestRegistryBurstOfKeys: after a burst of distinct keys the registry is
// back to zero keys and gives the memory back.
func TestRegistryBurstOfKeys(t *testing.T) {
	const n = 200_000
	reg := registry.New[string](1)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("org-%d/model", i)
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	held := make([]*slots.Slot, n)
	for i, k := range keys {
		s, err := reg.TryAcquire(k)
		require.NoError(t, err)
		held[i] = s
	}
	require.Equal(t, n, reg.Keys())
	peak := heap()
	for i, s := range held {
		s.Release()
		held[i] = nil
	}
	after := heap()
	assert.Equal(t, 0, reg.Keys())
	grown, kept := peak-before, int64(after)-int64(before)
	t.Logf("heap: %d B before, %d B at peak, %d B after release", before, peak, after)
	assert.Less(t, kept, int64(grown/10), "maps shrink: at most a tenth of the burst's memory is kept")
	runtime.KeepAlive(keys)
}

func TestRegistryAllocs(t *testing.T) {
	reg := registry.New[string](8)
	keys := []string{"a", "b", "c"}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		s, err := reg.TryAcquire(keys[i%3])
		if err != nil {
			panic(err)
		}
		s.Release()
		i++
	})
	assert.LessOrEqual(t, allocs, 1.0, "TryAcquire+Release allocates the Slot only")

	// AcquireAll on two keys: the Slot, its record of the keys and their
	// links, the keys' entries (none beside it waits).
	ctx := context.Background()
	allocs = testing.AllocsPerRun(1000, func() {
		s, err := reg.AcquireAll(ctx, "provider", keys[i%3])
		if err != nil {
			panic(err)
		}
		s.Release()
		i++
	})
	assert.LessOrEqual(t, allocs, 9.0, "AcquireAll+Release on two keys")
}

func TestRegistryHolders(t *testing.T) {
	mock := clock.NewMock()
	reg := registry.New[string](4, slots.WithClock(mock))
	a, _ := reg.TryAcquire("a")
	mock.Add(time.Minute)
	m, _ := reg.TryAcquireAll("a", "b")
	var all []registry.Holder[string]
	for i := range reg.Shards() {
		all = reg.HoldersInShard(i, all)
	}
	assert.Len(t, all, 3, "a multi-key slot is listed once per key")
	assert.ElementsMatch(t, all, reg.Holders(nil))
	byID := map[uint64][]string{}
	for _, h := range all {
		byID[h.ID] = append(byID[h.ID], h.Key)
		if h.ID == a.ID() {
			assert.True(t, h.AcquiredAt.Equal(a.AcquiredAt()))
		}
	}
	assert.Equal(t, []string{"a"}, byID[a.ID()])
	assert.ElementsMatch(t, []string{"a", "b"}, byID[m.ID()])
	a.Release()
	m.Release()
	assert.Empty(t, reg.Holders(nil))
}

// quiet discards the warnings that a test provokes on purpose.
var quiet = slog.New(slog.DiscardHandler)

// countingHandler counts the records logged at Warn or above.
type countingHandler struct{ n *atomic.Int32 }

func (h countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h countingHandler) Handle(context.Context, slog.Record) error {
	h.n.Add(1)
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestRegistryEvents: the registry reports the same events as a Limiter, a
// multi-key slot once.
func TestRegistryEvents(t *testing.T) {
	var acquired, released, rejected atomic.Int32
	obs := slots.ObserverFunc(func(e slots.Event) {
		switch e.Kind {
		case slots.EventAcquired:
			acquired.Add(1)
		case slots.EventReleased:
			released.Add(1)
		case slots.EventRejected:
			rejected.Add(1)
		}
	})
	reg := registry.New[string](1, slots.WithObserver(obs))
	a, _ := reg.TryAcquire("k")
	_, err := reg.TryAcquire("k")
	assert.Error(t, err)
	m, _ := reg.TryAcquireAll("p", "q")
	_, err = reg.TryAcquire(strings.Repeat("x", registry.DefaultMaxKeyBytes+1))
	assert.ErrorIs(t, err, registry.ErrInvalidKey)
	a.Release()
	m.Release()
	assert.Equal(t, int32(2), acquired.Load())
	assert.Equal(t, int32(2), released.Load())
	assert.Equal(t, int32(2), rejected.Load())
}

func TestRegistryLeakDetection(t *testing.T) {
	var leaked atomic.Int32
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventLeaked {
			leaked.Add(1)
		}
	})
	var keysLogged keyLog
	reg := registry.New[string](1, slots.WithLeakDetection(), slots.WithObserver(obs), slots.WithLogger(slog.New(&keysLogged)))
	func() {
		a, err := reg.TryAcquire("org-a")
		require.NoError(t, err)
		m, err := reg.AcquireAll(context.Background(), "zai", "zai/glm-5")
		require.NoError(t, err)
		e, err := reg.TryAcquire("") // the empty key is a key too, and named
		require.NoError(t, err)
		_, _, _ = a, m, e // all dropped while held
	}()
	// The reports come after the capacity: wait for the reports.
	for i := 0; leaked.Load() < 3; i++ {
		require.Less(t, i, 500, "the dropped slots were never reclaimed")
		runtime.GC()
		runtime.Gosched()
	}
	assert.Equal(t, 0, reg.Keys())
	assert.Equal(t, uint64(3), reg.Stats().Leaked)
	assert.Equal(t, int32(3), leaked.Load(), "each leak reported once")
	assert.ElementsMatch(t, []string{"org-a", "zai", ""}, keysLogged.list(), "the log names the key, read before it went idle")

	kept, err := reg.TryAcquire("org-a")
	require.NoError(t, err)
	for range 5 {
		runtime.GC()
	}
	assert.Equal(t, 1, reg.InFlight("org-a"), "a slot still referenced stays")
	assert.True(t, kept.Release())
	assert.Equal(t, 0, reg.Keys())
}

// An Observer that panics when told of the release of a dropped slot,
// reclaimed on a goroutine of the runtime's, is logged to the Registry's
// logger (WithLogger), for one key and for several; slog's default logger
// hears nothing of it.
func TestRegistryReclaimPanicLoggedToItsLogger(t *testing.T) {
	var logged, elsewhere testrig.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&elsewhere, nil)))
	defer slog.SetDefault(old)
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased {
			panic("an observer's bug")
		}
	})
	reg := registry.New[string](1, slots.WithLeakDetection(), slots.WithObserver(obs), slots.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	func() {
		_, err := reg.TryAcquire("org-a")
		require.NoError(t, err)
		_, err = reg.TryAcquireAll("zai", "zai/glm-5")
		require.NoError(t, err)
	}()
	require.Eventually(t, func() bool { runtime.GC(); return reg.Stats().Leaked == 2 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		return strings.Count(logged.String(), "an observer's bug") == 2
	}, 10*time.Second, time.Millisecond, "%s", logged.String())
	assert.Equal(t, 0, reg.Keys(), "the capacity freed")
	assert.NotContains(t, elsewhere.String(), "recovered")
}

// keyLog keeps the "key" attribute of each record.
type keyLog struct {
	mu   sync.Mutex
	keys []string
}

func (k *keyLog) list() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...)
}
func (k *keyLog) Enabled(context.Context, slog.Level) bool { return true }
func (k *keyLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "key" {
			k.mu.Lock()
			k.keys = append(k.keys, a.Value.String())
			k.mu.Unlock()
		}
		return true
	})
	return nil
}
func (k *keyLog) WithAttrs([]slog.Attr) slog.Handler { return k }
func (k *keyLog) WithGroup(string) slog.Handler      { return k }

// TestLimiterOptionsAreTyped: a Registry takes every option of package
// slots and its own; a Limiter does not take the Registry's, and passing
// one to NewLimiter does not compile.
func TestLimiterOptionsAreTyped(t *testing.T) {
	limiterOption := reflect.TypeFor[slots.Option]()
	registryOption := reflect.TypeFor[registry.Option]()
	for name, o := range map[string]registry.Option{
		"shards":    registry.WithShards(4),
		"key bytes": registry.WithMaxKeyBytes(8),
	} {
		assert.False(t, reflect.TypeOf(o).Implements(limiterOption), "%s is no slots.Option", name)
	}
	assert.True(t, reflect.TypeOf(slots.WithMaxWait(time.Second)).Implements(registryOption), "a Registry takes the options of slots")
	assert.True(t, reflect.TypeOf(slots.WithClock(nil)).Implements(registryOption))
	_ = registry.New[string](1, slots.WithMaxWait(time.Second), registry.WithShards(4))
	assert.NotNil(t, registry.New[string](1, nil), "a nil option is ignored")
}
