package registry_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Every rejection of a multi-key admission names the key that was full.
func TestAcquireAllNamesTheFullKey(t *testing.T) {
	cases := []struct {
		name string
		opts []registry.Option
		call func(*registry.Registry[string]) error
		want error
	}{
		{"TryAcquireAll", nil, func(r *registry.Registry[string]) error {
			_, err := r.TryAcquireAll("a", "b", "c")
			return err
		}, slots.ErrLimitReached},
		{"AcquireAll with no queue", []registry.Option{slots.WithMaxQueue(0)}, func(r *registry.Registry[string]) error {
			_, err := r.AcquireAll(context.Background(), "a", "b", "c")
			return err
		}, slots.ErrQueueFull},
		{"AcquireAll past its maximum wait", []registry.Option{slots.WithMaxWait(time.Millisecond)}, func(r *registry.Registry[string]) error {
			_, err := r.AcquireAll(context.Background(), "a", "b", "c")
			return err
		}, slots.ErrWaitTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := registry.New[string](1, tc.opts...)
			held, err := reg.TryAcquire("b")
			require.NoError(t, err)
			err = tc.call(reg)
			require.ErrorIs(t, err, tc.want)
			var le *slots.LimitError
			require.True(t, errors.As(err, &le))
			assert.Equal(t, "b", le.Key)
			assert.Equal(t, 1, le.InFlight)
			assert.Equal(t, 1, le.Limit)
			held.Release()
			assert.Zero(t, reg.Keys(), "a rejection leaves nothing behind")
		})
	}
}

// The fault as found: a caller needing keys a, b, c and d, each held by a
// single-key caller that keeps releasing and taking it again, waited on
// (it was still waiting after 3 s). The holds are staggered, so that one of
// the four keys is always held; now the caller is served once MaxPassed
// slots of its keys have gone to the others.
func TestAcquireAllIsNotStarvedByChurn(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](1)
		keys := []string{"a", "b", "c", "d"}
		stop := make(chan struct{})
		var churn sync.WaitGroup
		for i, k := range keys {
			s, err := reg.TryAcquire(k)
			require.NoError(t, err)
			churn.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond)
				for {
					time.Sleep(4 * time.Millisecond) // a hold; the four end a millisecond apart
					s.Release()
					select {
					case <-stop:
						return
					default:
					}
					var err error
					if s, err = reg.Acquire(context.Background(), k); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		s, err := reg.AcquireAll(ctx, keys...)
		require.NoError(t, err, "the multi-key caller is served")
		// The first release comes at 4 ms; it and the next MaxPassed-1, a
		// millisecond apart, are taken again by their holders and pass it;
		// then its keys drain, the last one a hold (4 ms) later.
		assert.Equal(t, time.Duration(4+registry.MaxPassed-1+4)*time.Millisecond, time.Since(start))
		close(stop)
		s.Release()
		churn.Wait()
		assert.Zero(t, reg.Keys())
	})
}

// A property of random schedules: while an AcquireAll waits, callers that
// came after it take the last free slot of one of its keys at most
// MaxPassed times (they may take the others: its own is kept), and when
// its keys' holders are done it is served.
func TestAcquireAllPassedOverAtMostMaxPassed(t *testing.T) {
	for seed := range uint64(200) {
		testrig.Bubble(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			all := []string{"a", "b", "c", "d"}
			reg := registry.New[string](1 + rng.IntN(3))
			for _, k := range all {
				reg.SetLimit(k, 1+rng.IntN(3))
			}
			rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
			need := all[:2+rng.IntN(3)]
			var held []*slots.Slot
			// Its keys are busy when it comes: one of them is full.
			for range reg.Limit(need[0]) {
				s, err := reg.TryAcquire(need[0])
				require.NoError(t, err)
				held = append(held, s)
			}
			got := make(chan *slots.Slot, 1)
			go func() {
				s, err := reg.AcquireAll(context.Background(), need...)
				assert.NoError(t, err)
				got <- s
			}()
			synctest.Wait()
			passes := 0
			var multi *slots.Slot
			for range 200 {
				if len(held) > 0 && rng.IntN(2) == 0 {
					i := rng.IntN(len(held))
					held[i].Release()
					held = slices.Delete(held, i, i+1)
				} else {
					k := all[rng.IntN(len(all))]
					last := reg.InFlight(k)+1 == reg.Limit(k)
					if s, err := reg.TryAcquire(k); err == nil {
						held = append(held, s)
						if last && slices.Contains(need, k) {
							passes++
						}
					}
				}
				synctest.Wait()
				select {
				case multi = <-got:
				default:
				}
				if multi != nil {
					break
				}
			}
			assert.LessOrEqual(t, passes, registry.MaxPassed, "seed %d: passed over", seed)
			for _, s := range held {
				s.Release()
			}
			synctest.Wait()
			if multi == nil {
				select {
				case multi = <-got:
				default:
					t.Fatalf("seed %d: not served once its keys were free", seed)
				}
			}
			multi.Release()
			assert.Zero(t, reg.Keys())
		})
	}
}

// The bound is reached: after MaxPassed passes, each of the waiter's keys
// keeps a slot for it, and only one.
func TestAcquireAllBoundIsReached(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](1)
		a, err := reg.TryAcquire("a")
		require.NoError(t, err)
		b, err := reg.TryAcquire("b")
		require.NoError(t, err)
		got := make(chan *slots.Slot, 1)
		go func() {
			s, err := reg.AcquireAll(context.Background(), "a", "b")
			assert.NoError(t, err)
			got <- s
		}()
		synctest.Wait()
		for i := range registry.MaxPassed {
			a.Release()
			a, err = reg.TryAcquire("a")
			require.NoError(t, err, "pass %d: a newcomer may still take a", i+1)
		}
		a.Release()
		_, err = reg.TryAcquire("a")
		require.ErrorIs(t, err, slots.ErrLimitReached, "after MaxPassed passes a's free slot is kept for the waiter")
		assert.Equal(t, 0, reg.InFlight("a"))
		_, err = reg.TryAcquireAll("a", "c")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "also for a multi-key newcomer")
		reg.SetLimit("a", 2)
		s2, err := reg.TryAcquire("a")
		require.NoError(t, err, "one slot of a is kept for it, not two")
		_, err = reg.TryAcquire("a")
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		s2.Release()
		reg.SetLimit("a", 1)
		s, err := reg.TryAcquire("c")
		require.NoError(t, err, "a key it does not need is not held back")
		s.Release()
		synctest.Wait()
		assert.Len(t, got, 0, "it still waits for b")
		b.Release()
		synctest.Wait()
		multi := <-got
		_, err = reg.TryAcquire("a")
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		multi.Release()
		s, err = reg.TryAcquire("a")
		require.NoError(t, err, "once served, it holds nothing back")
		s.Release()
		assert.Zero(t, reg.Keys())
	})
}

// Several AcquireAll callers with overlapping keys in random orders, and
// single-key callers that churn: none deadlocks, every one is served once
// the churn stops, and no key's cap is exceeded.
func TestAcquireAllNoDeadlockInAnyKeyOrder(t *testing.T) {
	for seed := range uint64(100) {
		testrig.Bubble(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 2))
			keys := []string{"a", "b", "c", "d", "e"}
			reg := registry.New[string](1 + rng.IntN(2))
			var mu sync.Mutex
			inFlight := map[string]int{}
			hold := func(ks []string, d int) {
				mu.Lock()
				for _, k := range ks {
					inFlight[k] += d
					if inFlight[k] > reg.Limit(k) {
						t.Errorf("key %s: %d in flight, limit %d", k, inFlight[k], reg.Limit(k))
					}
				}
				mu.Unlock()
			}
			var wg sync.WaitGroup
			for range 6 {
				ks := slices.Clone(keys)
				rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
				ks = ks[:2+rng.IntN(3)]
				churns := rng.IntN(3)
				holdFor := time.Duration(1+rng.IntN(5)) * time.Millisecond
				wg.Go(func() {
					for range 1 + churns {
						s, err := reg.AcquireAll(context.Background(), ks...)
						if !assert.NoError(t, err) {
							return
						}
						hold(ks, 1)
						time.Sleep(holdFor) // fake time: a hold
						hold(ks, -1)
						s.Release()
					}
				})
			}
			for _, k := range keys {
				wg.Go(func() {
					for range 20 {
						s, err := reg.Acquire(context.Background(), k)
						if !assert.NoError(t, err) {
							return
						}
						hold([]string{k}, 1)
						time.Sleep(time.Millisecond)
						hold([]string{k}, -1)
						s.Release()
					}
				})
			}
			wg.Wait()
			assert.Zero(t, reg.Keys())
		})
	}
}
