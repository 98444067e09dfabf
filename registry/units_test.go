package registry_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

func TestRegistryCountsUnits(t *testing.T) {
	reg := registry.New[string](10)
	a, err := reg.TryAcquireN("org", 7)
	require.NoError(t, err)
	assert.Equal(t, 7, a.Units())
	assert.Equal(t, 7, reg.InFlight("org"))
	_, err = reg.TryAcquireN("org", 4)
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	b, err := reg.TryAcquireN("org", 3)
	require.NoError(t, err)
	hs := reg.Holders(nil)
	units := 0
	for _, h := range hs {
		units += h.Units
	}
	assert.Equal(t, 10, units)
	assert.Equal(t, 10, reg.Stats().InFlight)

	// Several keys: the units are taken on each, all or nothing.
	_, err = reg.TryAcquireAllN(2, "org", "model")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, 0, reg.InFlight("model"), "a refusal takes nothing")
	a.Release()
	m, err := reg.TryAcquireAllN(5, "org", "model", "org")
	require.NoError(t, err)
	assert.Equal(t, 8, reg.InFlight("org"))
	assert.Equal(t, 5, reg.InFlight("model"))
	m.Release()
	b.Release()
	assert.Equal(t, 0, reg.InFlight("org"))
	assert.Equal(t, 0, reg.Keys(), "idle keys are dropped")
}

func TestRegistryRefusesUnitsOutOfRange(t *testing.T) {
	reg := registry.New[string](10)
	for _, n := range []int{0, -3, slots.MaxUnits + 1} {
		_, err := reg.TryAcquireN("k", n)
		assert.ErrorIs(t, err, slots.ErrBadUnits)
		_, err = reg.AcquireN(context.Background(), "k", n)
		assert.ErrorIs(t, err, slots.ErrBadUnits)
		_, err = reg.TryAcquireAllN(n, "k", "j")
		assert.ErrorIs(t, err, slots.ErrBadUnits)
		_, err = reg.AcquireAllN(context.Background(), n, "k", "j")
		assert.ErrorIs(t, err, slots.ErrBadUnits)
	}
	assert.Equal(t, 0, reg.Keys(), "a refusal inserts nothing")

	// As with slots.Limiter.AcquireN and pacing.Gate.AcquireN, a weight out
	// of range is told before a nil context, with one rejection event.
	var events []slots.Event
	reg = registry.New[string](10, slots.WithObserver(slots.ObserverFunc(func(e slots.Event) { events = append(events, e) })))
	_, err := reg.AcquireN(nil, "k", 0) //nolint:staticcheck // a nil context on purpose
	assert.ErrorIs(t, err, slots.ErrBadUnits)
	_, err = reg.AcquireAllN(nil, 0, "k", "j") //nolint:staticcheck // a nil context on purpose
	assert.ErrorIs(t, err, slots.ErrBadUnits)
	_, err = reg.AcquireN(nil, "k", 1) //nolint:staticcheck // a nil context on purpose
	assert.ErrorIs(t, err, slots.ErrNilContext)
	_, lerr := slots.NewLimiter(1).AcquireN(nil, 0) //nolint:staticcheck // a nil context on purpose
	assert.ErrorIs(t, lerr, slots.ErrBadUnits)
	require.Len(t, events, 3)
	for i, want := range []error{slots.ErrBadUnits, slots.ErrBadUnits, slots.ErrNilContext} {
		assert.Equal(t, slots.EventRejected, events[i].Kind)
		assert.ErrorIs(t, events[i].Err, want)
	}
}

// A caller heavier than a key's limit is refused at once, on a key that is
// live or not, alone or among several; one waiting is refused when the
// key's limit is lowered below it, and the key goes idle.
func TestRegistryRefusesMoreThanTheLimit(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](10)
		reg.SetLimit("small", 3)
		_, err := reg.AcquireN(context.Background(), "fresh", 11)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
		_, err = reg.TryAcquireN("fresh", 11)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
		_, err = reg.AcquireAllN(context.Background(), 4, "big", "small")
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "small", le.Key, "the key that can never hold it is named")
		assert.Equal(t, 0, reg.Keys())
		assert.Equal(t, uint64(3), reg.Stats().ExceedsLimit)

		hold, err := reg.TryAcquireN("live", 6)
		require.NoError(t, err)
		_, err = reg.AcquireN(context.Background(), "live", 11)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit, "refused at once on a live key too")

		one := make(chan error, 1)
		all := make(chan error, 1)
		go func() {
			_, err := reg.AcquireN(context.Background(), "live", 8)
			one <- err
		}()
		go func() {
			_, err := reg.AcquireAllN(context.Background(), 7, "other", "live")
			all <- err
		}()
		synctest.Wait()
		assert.Equal(t, 2, reg.Waiting("live"))
		reg.SetLimit("live", 7)
		synctest.Wait()
		assert.ErrorIs(t, <-one, slots.ErrExceedsLimit, "8 units can never fit a limit of 7")
		assert.Equal(t, 1, reg.Waiting("live"), "7 units still can")
		reg.SetLimit("live", 6)
		synctest.Wait()
		err = <-all
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 0, reg.Waiting("other"), "it left every key's queue")
		assert.Equal(t, 1, reg.Keys(), "only the live holder's key is left")
		hold.Release()
		assert.Equal(t, 0, reg.Keys())
	})
}

// A caller waiting for n units of one key that do not fit lets later
// callers of its flow take free units until they have taken
// core.PassFactor times n (TryAcquire, which
// never queues, takes none while anyone waits); from then on it keeps its
// place, and the callers after one that leaves are served at once.
func TestRegistryHeavyWaiterKeepsItsPlace(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](10)
		a, err := reg.TryAcquireN("p", 8)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		heavy := make(chan error, 1)
		go func() {
			_, err := reg.AcquireN(ctx, "p", 5)
			heavy <- err
		}()
		synctest.Wait()
		_, err = reg.TryAcquire("p")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "TryAcquire does not pass a waiter")
		passers := 5 * core.PassFactor // of one unit, in its flow
		var last *slots.Slot
		for i := range passers {
			s, err := reg.Acquire(context.Background(), "p")
			require.NoError(t, err, "pass %d of %d", i+1, passers)
			if i < passers-1 {
				s.Release()
			} else {
				last = s
			}
		}
		assert.Equal(t, 9, reg.InFlight("p"))
		light := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.Acquire(context.Background(), "p")
			assert.NoError(t, err)
			light <- s
		}()
		synctest.Wait()
		assert.Equal(t, 2, reg.Waiting("p"), "1 unit free, kept for the heavy waiter passed by its bound")

		cancel()
		assert.ErrorIs(t, <-heavy, context.Canceled)
		synctest.Wait()
		s := <-light
		assert.Equal(t, 10, reg.InFlight("p"), "the light caller was served once the heavy one left")
		s.Release()
		last.Release()
		a.Release()
		assert.Equal(t, 0, reg.Keys())
	})
}

// A caller waiting for n units of several keys may be passed on them, as
// any AcquireAll, at most MaxPassed times; from then on each key keeps its
// n units for it.
func TestRegistryHeavyAcquireAllPassedAtMostMaxPassed(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](10)
		a, err := reg.TryAcquireN("p", 8)
		require.NoError(t, err)
		got := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireAllN(context.Background(), 5, "p", "m")
			assert.NoError(t, err)
			got <- s
		}()
		synctest.Wait()
		for i := range registry.MaxPassed {
			s, err := reg.TryAcquire("p")
			require.NoError(t, err, "pass %d", i+1)
			s.Release()
		}
		_, err = reg.TryAcquire("p")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "passed over MaxPassed times, it keeps its 5 units")
		a.Release()
		s := <-got
		assert.Equal(t, 5, reg.InFlight("p"))
		assert.Equal(t, 5, reg.InFlight("m"))
		s.Release()
		assert.Equal(t, 0, reg.Keys())
	})
}

// TestRegistryUnitsHammer: 48 goroutines take 1 to 4 units of one key or
// of two at once, with cancellations racing their grants, timeouts and
// limits moving between 6 and 9; independent counts check every key's cap
// at every admission.
func TestRegistryUnitsHammer(t *testing.T) {
	const maxLimit, goroutines, iters = 9, 48, 60
	keys := []string{"provider", "model-a", "model-b", "org-1"}
	reg := registry.New[string](maxLimit, registry.WithShards(4), slots.WithMaxWait(2*time.Millisecond))
	counts := map[string]*atomic.Int64{}
	for _, k := range keys {
		counts[k] = new(atomic.Int64)
	}
	var admitted, rejected atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 13))
			for range iters {
				n := 1 + rng.IntN(4)
				ks := []string{keys[rng.IntN(len(keys))]}
				var s *slots.Slot
				var err error
				switch rng.IntN(6) {
				case 0:
					s, err = reg.TryAcquireN(ks[0], n)
				case 1:
					reg.SetLimit(keys[rng.IntN(len(keys))], 6+rng.IntN(4))
					s, err = reg.TryAcquireN(ks[0], n)
				case 2, 3:
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(2) == 0 {
						go cancel()
					}
					s, err = reg.AcquireN(ctx, ks[0], n)
					cancel()
				default:
					ks = []string{"provider", keys[1+rng.IntN(len(keys)-1)]}
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(3) == 0 {
						go cancel()
					}
					s, err = reg.AcquireAllN(ctx, n, ks...)
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
					if got := counts[k].Add(int64(n)); got > maxLimit {
						t.Errorf("key %s: %d units in flight, over %d", k, got, maxLimit)
					}
				}
				if rng.IntN(2) == 0 {
					runtime.Gosched()
				}
				for _, k := range ks {
					counts[k].Add(-int64(n))
				}
				if !s.Release() {
					t.Error("first release reported false")
				}
			}
		})
	}
	wg.Wait()
	assert.Positive(t, admitted.Load())
	st := reg.Stats()
	assert.Equal(t, 0, st.InFlight)
	assert.Equal(t, 0, st.Waiting)
	assert.Equal(t, 0, reg.Keys(), "every key idle and dropped")
	t.Logf("%d admitted, %d refused", admitted.Load(), rejected.Load())
}

func TestRegistryUnitsAllocs(t *testing.T) {
	reg := registry.New[string](8)
	allocs := testing.AllocsPerRun(1000, func() {
		s, err := reg.TryAcquireN("k", 3)
		if err != nil {
			panic(err)
		}
		s.Release()
	})
	assert.LessOrEqual(t, allocs, 1.0, "TryAcquireN+Release allocates the Slot only")
}

// A heavy waiter on one key is served in the key's order, as a Limiter
// serves it: an interactive caller of 2 units goes before 100 older batch
// waiters, and a flow's caller of 2 units goes after one turn of another
// flow's 100 older waiters, not after all of them (no shares), once
// its bound has passed it.
func TestRegistryHeavyWaiterServedInOrderAsTheLimiter(t *testing.T) {
	type units struct{}
	for name, waiting := range map[string]context.Context{
		"class": batch,
		"flow":  slots.WithFlow(context.Background(), "A"),
	} {
		heavy := context.WithValue(interactive, units{}, 2)
		if name == "flow" {
			heavy = context.WithValue(slots.WithFlow(context.Background(), "B"), units{}, 2)
		}
		for _, owner := range []string{"registry", "limiter"} {
			t.Run(name+"/"+owner, func(t *testing.T) {
				testrig.Bubble(t, func(t *testing.T) {
					reg, l := registry.New[string](4), slots.NewLimiter(4)
					r := testrig.New(t, func(ctx context.Context) (*slots.Slot, error) {
						n, _ := ctx.Value(units{}).(int)
						n = max(n, 1)
						if owner == "limiter" {
							return l.AcquireN(ctx, n)
						}
						return reg.AcquireN(ctx, "p", n)
					})
					for range 104 { // 4 hold, 100 wait
						r.Add(waiting, "older")
					}
					r.Add(heavy, "heavy")
					for range 30 {
						r.ReleaseOldest()
					}
					// The first 4 hold before it (and in flows, A's turn of
					// 2 units comes first); then a release frees one unit,
					// which a caller of one, of another class or flow,
					// passes it to take: that is the bound (Waiter.Pass);
					// two releases later it is served.
					want := 4 + 1
					if name == "flow" {
						want += 2
					}
					pos := slices.Index(r.Order(), "heavy")
					assert.Equal(t, want, pos, "granted at %d (-1: not yet)", pos)
					r.ReleaseAll()
				})
			})
		}
	}
}

// A weighted caller of a key is told when the units it needs free: a
// holder's end frees all it holds, whichever path refused it.
func TestRegistryRetryAfterCountsUnits(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](100, slots.WithMaxWait(100*time.Millisecond))
		testrig.WarmHolds(t, time.Second, func() (*slots.Slot, error) { return reg.TryAcquire("org") })
		big, err := reg.TryAcquireN("org", 60)
		require.NoError(t, err)
		defer big.Release()
		time.Sleep(300 * time.Millisecond)
		var le *slots.LimitError
		_, err = reg.TryAcquireN("org", 50)
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 700*time.Millisecond, le.RetryAfter, "50 units beside a holder of 60: when it ends")

		_, err = reg.TryAcquireAllN(45, "org", "other")
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 700*time.Millisecond, le.RetryAfter, "several keys: the same, behind the 50 told (95 of 100)")

		_, err = reg.AcquireN(context.Background(), "org", 50)
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		// At 400 ms, behind 95 units told: 1.6 s less its lead, half a
		// hundredth of a hold.
		assert.Equal(t, 1595*time.Millisecond, le.RetryAfter, "a wait timed out: a round later, as 145 units are needed")
	})
}
