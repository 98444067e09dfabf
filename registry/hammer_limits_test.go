package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// Real goroutines: AcquireAllN over one to three keys, TryAcquire,
// cancellations racing grants, SetLimit, ClearLimit and a LimitFunc that
// changes, fails and panics, refreshed by RefreshLimits: no key ever holds
// more units than the highest limit it was ever given (an independent
// count), every caller returns, and nothing is left.
func TestRegistryHammerWithChangingLimits(t *testing.T) {
	for _, shares := range []bool{false, true} {
		t.Run(fmt.Sprint("shares ", shares), func(t *testing.T) { hammerWithChangingLimits(t, shares) })
	}
}

func hammerWithChangingLimits(t *testing.T, shares bool) {
	keys := []string{"p", "m0", "m1", "m2"}
	const hi = 5 // every limit is 2..hi
	var src [4]atomic.Int32
	var mode atomic.Int32
	for i := range src {
		src[i].Store(3)
	}
	fn := func(ctx context.Context, k string) (int, error) {
		switch mode.Load() {
		case 1:
			return 0, errors.New("down")
		case 2:
			panic("boom")
		}
		return int(src[k[len(k)-1]%4].Load()), nil
	}
	opts := []registry.Option{registry.WithShards(4), slots.WithLogger(slog.New(slog.DiscardHandler))}
	if shares {
		opts = append(opts, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}),
			slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 1}))
	}
	reg := registry.NewWithLimitFunc[string](3, fn, time.Millisecond, opts...)
	var mu sync.Mutex
	inFlight := map[string]int{}
	prios := []slots.Priority{slots.PriorityInteractive, slots.PriorityDefault, slots.PriorityBatch}
	stop := make(chan struct{})
	var changer sync.WaitGroup
	changer.Go(func() {
		rng := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := keys[rng.IntN(len(keys))]
			switch rng.IntN(4) {
			case 0:
				reg.SetLimit(k, 2+rng.IntN(hi-1))
			case 1:
				reg.ClearLimit(k)
			case 2:
				src[rng.IntN(4)].Store(int32(2 + rng.IntN(hi-1)))
				reg.RefreshLimits(func(string) bool { return true })
			default:
				mode.Store(int32(max(rng.IntN(6)-3, 0)))
			}
			runtime.Gosched()
		}
	})
	var wg sync.WaitGroup
	var admitted, failed atomic.Int64
	for g := range 24 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for range 300 {
				ctx := slots.WithPriority(context.Background(), prios[rng.IntN(3)])
				ctx = slots.WithFlowWeight(ctx, fmt.Sprint("f", rng.IntN(3)), 1+rng.IntN(2))
				cancel := context.CancelFunc(func() {})
				if rng.IntN(4) == 0 {
					ctx, cancel = context.WithCancel(ctx)
					go cancel()
				}
				ks := []string{keys[rng.IntN(len(keys))]}
				for range rng.IntN(3) {
					ks = append(ks, keys[rng.IntN(len(keys))])
				}
				n := 1 + rng.IntN(2)
				var s *slots.Slot
				var err error
				if rng.IntN(5) == 0 {
					s, err = reg.TryAcquireAllN(n, ks...)
				} else {
					s, err = reg.AcquireAllN(ctx, n, ks...)
				}
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) && !errors.Is(err, slots.ErrLimitReached) && !errors.Is(err, slots.ErrExceedsLimit) {
						t.Errorf("unexpected error: %v", err)
					}
					failed.Add(1)
					continue
				}
				admitted.Add(1)
				seen := map[string]bool{}
				mu.Lock()
				for _, k := range ks {
					if !seen[k] {
						seen[k] = true
						if inFlight[k] += n; inFlight[k] > hi {
							t.Errorf("key %s: %d units in flight, over every limit set (%d)", k, inFlight[k], hi)
						}
					}
				}
				mu.Unlock()
				runtime.Gosched()
				mu.Lock()
				for k := range seen {
					inFlight[k] -= n
				}
				mu.Unlock()
				s.Release()
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		for _, k := range keys {
			t.Logf("key %s: limit %d, in flight %d, waiting %d", k, reg.Limit(k), reg.InFlight(k), reg.Waiting(k))
		}
		close(stop)
		changer.Wait()
		mode.Store(0)
		for _, k := range keys {
			reg.SetLimit(k, 100)
		}
		select {
		case <-done:
			t.Fatalf("callers were stuck until the limits were raised: %+v", reg.Stats())
		case <-time.After(10 * time.Second):
			t.Fatalf("callers stuck: %+v", reg.Stats())
		}
	}
	close(stop)
	changer.Wait()
	for _, k := range keys {
		reg.ClearLimit(k)
	}
	st := reg.Stats()
	t.Logf("admitted %d, failed %d, %+v", admitted.Load(), failed.Load(), st)
	assert.Zero(t, reg.Keys())
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.Waiting)
	assert.Equal(t, st.Acquired, st.Released)
	assert.LessOrEqual(t, uint64(admitted.Load()), st.Acquired, "a grant given back counts as Acquired too")
}
