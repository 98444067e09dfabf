package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// Random acquisitions, tries, releases, cancellations, SetLimit and
// ClearLimit, with limits fetched from a LimitFunc that changes, fails,
// panics and is slow, refreshed by time and RefreshLimits: no waiter is
// left queued while it could be served, and everything ends clean.
func TestNoServableWaiterLeftWithLimitFunc(t *testing.T) {
	keys := []string{"p", "m0", "m1"}
	for seed := range uint64(1000) {
		testrig.Bubble(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			var mu sync.Mutex
			source := map[string]int{"p": 3, "m0": 2, "m1": 4}
			mode := 0 // 0: answer; 1: fail; 2: panic
			slow := false
			returned := map[string]int{} // the highest limit fn returned in a step
			fn := func(ctx context.Context, k string) (int, error) {
				mu.Lock()
				n, md, sl := source[k], mode, slow
				mu.Unlock()
				if sl {
					time.Sleep(time.Second)
				}
				mu.Lock()
				returned[k] = max(returned[k], n)
				mu.Unlock()
				switch md {
				case 1:
					return 0, errors.New("down")
				case 2:
					panic("boom")
				}
				return n, nil
			}
			opts := []Option{WithShards(2), slots.WithLogger(slog.New(slog.DiscardHandler))}
			maxUnits := 1 + int(seed%3)
			if seed%2 == 0 {
				opts = append(opts, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
			}
			switch seed % 6 {
			case 1:
				opts = append(opts, slots.WithMaxWait(3*time.Second))
			case 3:
				opts = append(opts, slots.WithMaxQueue(2))
			case 5:
				opts = append(opts, slots.WithMaxWait(3*time.Second), slots.WithFailOpen(), slots.WithMaxQueuePerFlow(1))
			}
			reg := NewWithLimitFunc[string](2, fn, 10*time.Second, opts...)
			prios := []slots.Priority{slots.PriorityInteractive, slots.PriorityDefault, slots.PriorityBatch}
			var held []*slots.Slot
			var cancels []context.CancelFunc
			var trace []string
			var wg sync.WaitGroup
			prevIDs := map[string]map[uint64]bool{}
			prevLimit := map[string]int{}
			for _, k := range keys {
				prevLimit[k] = reg.Limit(k)
			}
			for step := range 80 {
				switch op := rng.IntN(14); {
				case op < 5:
					ctx, cancel := context.WithCancel(slots.WithPriority(context.Background(), prios[rng.IntN(3)]))
					ctx = slots.WithFlow(ctx, fmt.Sprint("f", rng.IntN(2)))
					cancels = append(cancels, cancel)
					ks := []string{keys[rng.IntN(len(keys))]}
					if rng.IntN(2) == 0 {
						ks = append(ks, keys[rng.IntN(len(keys))])
					}
					n := 1 + rng.IntN(maxUnits)
					trace = append(trace, fmt.Sprintf("acquire %d of %v %v", n, ks, slots.PriorityFrom(ctx)))
					wg.Go(func() {
						if s, err := reg.AcquireAllN(ctx, n, ks...); err == nil {
							mu.Lock()
							held = append(held, s)
							mu.Unlock()
						}
					})
				case op < 6:
					ks := []string{keys[rng.IntN(len(keys))]}
					trace = append(trace, fmt.Sprintf("try %v", ks))
					wg.Go(func() {
						if s, err := reg.TryAcquireAll(ks...); err == nil {
							mu.Lock()
							held = append(held, s)
							mu.Unlock()
						}
					})
				case op < 9:
					releaseAny(rng, &mu, &held, &trace)
				case op < 10:
					if len(cancels) > 0 {
						trace = append(trace, "cancel")
						cancels[rng.IntN(len(cancels))]()
					}
				case op < 11:
					k := keys[rng.IntN(len(keys))]
					if rng.IntN(2) == 0 {
						n := 1 + rng.IntN(4)
						trace = append(trace, fmt.Sprintf("SetLimit %s %d", k, n))
						reg.SetLimit(k, n)
					} else {
						trace = append(trace, "ClearLimit "+k)
						reg.ClearLimit(k)
					}
				case op < 12:
					k, n := keys[rng.IntN(len(keys))], 1+rng.IntN(4)
					md, sl := rng.IntN(5), rng.IntN(3) == 0
					if md > 2 {
						md = 0
					}
					trace = append(trace, fmt.Sprintf("source %s %d mode %d slow %v; refresh", k, n, md, sl))
					mu.Lock()
					source[k], mode, slow = n, md, sl
					mu.Unlock()
					reg.RefreshLimits(func(string) bool { return true })
				default:
					d := time.Duration(1+rng.IntN(12)) * time.Second
					trace = append(trace, fmt.Sprint("sleep ", d))
					time.Sleep(d)
				}
				synctest.Wait()
				if msg := reg.servableWaiter(); msg != "" {
					t.Fatalf("seed %d, step %d:\n%s%v", seed, step, msg, trace)
				}
				ids := map[string]map[uint64]bool{}
				oldU, newU := map[string]int{}, map[string]int{}
				for _, h := range reg.Holders(nil) {
					if ids[h.Key] == nil {
						ids[h.Key] = map[uint64]bool{}
					}
					ids[h.Key][h.ID] = true
					if prevIDs[h.Key][h.ID] {
						oldU[h.Key] += h.Units
					} else {
						newU[h.Key] += h.Units
					}
				}
				mu.Lock()
				ret := returned
				returned = map[string]int{}
				mu.Unlock()
				for _, k := range keys {
					lim := reg.Limit(k)
					if newU[k] > 0 && oldU[k]+newU[k] > max(lim, prevLimit[k], ret[k]) {
						t.Fatalf("seed %d, step %d: key %s: %d units held before, %d admitted, limit %d then %d\n%v", seed, step, k, oldU[k], newU[k], prevLimit[k], lim, trace)
					}
					prevLimit[k] = lim
				}
				prevIDs = ids
			}
			for _, c := range cancels {
				c()
			}
			mu.Lock()
			slow = false
			mu.Unlock()
			time.Sleep(time.Minute)
			wg.Wait()
			for _, s := range held {
				s.Release()
			}
			for _, k := range keys {
				reg.ClearLimit(k)
			}
			st := reg.Stats()
			if reg.Keys() != 0 || st.InFlight != 0 || st.Waiting != 0 || st.Acquired != st.Released {
				t.Fatalf("seed %d: %d keys left, stats %+v\n%v", seed, reg.Keys(), st, trace)
			}
		})
	}
}
