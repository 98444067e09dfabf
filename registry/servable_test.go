package registry

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// servableWaiter describes a waiter that could be served now but is still
// queued (or a count of urgent multi-key waiters that is wrong), or
// returns "". With every event dispatching what it may unblock,
// there is none once the registry is quiet.
func (r *Registry[K]) servableWaiter() string {
	r.multiMu.Lock()
	defer r.multiMu.Unlock()
	all := make([]int, len(r.shards))
	for i := range all {
		all[i] = i
	}
	r.lockShards(all)
	defer r.unlockShards(all)
	var msg string
	for i := range r.shards {
		r.shards[i].lanes.each(func(e *entry[K]) {
			urgent := 0
			for el := e.multis.Front(); el != nil; el = el.Next() {
				if el.Value.Hold.Owner.(*multi[K]).urgent() {
					urgent++
				}
			}
			if urgent != e.urgent {
				msg += fmt.Sprintf("key %v: %d urgent multi-key waiters counted, %d queue\n", e.key, e.urgent, urgent)
			}
			if e.lane.Waiters.Heavy() == 0 {
				// Every waiter weighs one: any that may take a slot of
				// every key it needs, and that no older multi-key waiter
				// keeps the slot from, could be served.
				for c := range core.NumClasses {
					if !e.lane.CanTake(c, 1) {
						continue
					}
					for el := range e.lane.Waiters.Class(c) {
						w := el.Value
						if blockedLocked(e, c, w.Seq, 1) {
							continue
						}
						if m, ok := w.Hold.Owner.(*multi[K]); ok && m.blocking(w, 1, new(turns[K])) >= 0 {
							continue
						}
						msg += fmt.Sprintf("key %v: a class %d waiter could be served (limit %d, %d holders, %d waiting)\n",
							e.key, c, e.lane.Limit, e.lane.Holders.Len(), e.lane.Waiters.Len())
					}
				}
				return
			}
			// With heavier waiters, what the grant loop would choose now
			// (candidateLocked; its rules are tested apart).
			w, _ := r.candidateLocked(e, new(turns[K]), nil)
			if w != nil {
				msg += fmt.Sprintf("key %v: a class %d waiter of %d units could be served (limit %d, %d units held, %d waiting)\n",
					e.key, w.Class, w.Hold.Units(), e.lane.Limit, e.lane.Holders.Units(), e.lane.Waiters.Len())
			}
		})
	}
	return msg
}

// Random acquisitions (one key or two, random classes and flows), releases,
// cancellations and limit changes, with shares, each step let to settle: no
// waiter is ever left queued while it could be served.
func TestNoServableWaiterLeft(t *testing.T) { checkNoServableWaiterLeft(t, 1, true) }

// The same with callers weighing 1 to 3 units: none is left queued while
// it could be served in order, and a caller too heavy for a key is refused.
func TestNoServableWaiterLeftWithUnits(t *testing.T) { checkNoServableWaiterLeft(t, 3, true) }

// The same without shares, with callers weighing up to 2 and up to 4
// units and limits of 2 to 5. A heavy waiter for one key, first in that
// key's order (its flow's turn) but after a multi-key waiter by arrival,
// stopped that key's grant loop, while the multi-key waiter's other key
// judged by arrival that it could go: left queued by a release on the
// first key, it was served by the next event on the other.
//
// On two keys, for 200 steps: an admission that takes units from a key
// where a heavy waiter waits may let another go first (the oldest heavy
// waiter that cannot take its units, which keeps its place, is now an
// older one), so it serves the queues too (seed 1103 left one without).
func TestNoServableWaiterLeftWithUnitsNoShares(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprint(n, " units"), func(t *testing.T) { checkNoServableWaiterLeft(t, n, false) })
	}
	t.Run("two keys", func(t *testing.T) { checkServable(t, 4, false, []string{"m0", "m1"}, 200, 1500) })
}

func checkNoServableWaiterLeft(t *testing.T, maxUnits int, shares bool) {
	seeds := uint64(200)
	if !shares {
		seeds = 3000 // seed 2646 of 4 units left one (a multi-key grant on another key changed a flow's turn)
	}
	checkServable(t, maxUnits, shares, []string{"p", "m0", "m1", "m2"}, 80, seeds)
}

func checkServable(t *testing.T, maxUnits int, shares bool, keys []string, steps int, seeds uint64) {
	for seed := range seeds {
		testrig.Bubble(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			opts := []Option{WithShards(4)}
			limit := 3
			if shares {
				opts = append(opts, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1 + rng.IntN(2)}),
					slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: rng.IntN(2)}))
			} else {
				limit = 2 + int(seed%4)
			}
			reg := New[string](limit, opts...)
			prios := []slots.Priority{slots.PriorityInteractive, slots.PriorityDefault, slots.PriorityBatch}
			var mu sync.Mutex
			var held []*slots.Slot
			var cancels []context.CancelFunc
			var trace []string
			for step := range steps {
				switch op := rng.IntN(10); {
				case op < 5:
					ctx, cancel := context.WithCancel(slots.WithPriority(context.Background(), prios[rng.IntN(3)]))
					ctx = slots.WithFlow(ctx, fmt.Sprint("f", rng.IntN(3)))
					cancels = append(cancels, cancel)
					ks := []string{keys[rng.IntN(len(keys))]}
					if rng.IntN(2) == 0 {
						ks = append(ks, keys[rng.IntN(len(keys))])
					}
					n := 1 + rng.IntN(maxUnits)
					trace = append(trace, fmt.Sprintf("acquire %d of %v %v", n, ks, slots.PriorityFrom(ctx)))
					go func() {
						if s, err := reg.AcquireAllN(ctx, n, ks...); err == nil {
							mu.Lock()
							held = append(held, s)
							mu.Unlock()
						}
					}()
				case op < 8:
					releaseAny(rng, &mu, &held, &trace)
				case op < 9:
					if len(cancels) > 0 {
						trace = append(trace, "cancel")
						cancels[rng.IntN(len(cancels))]()
					}
				default:
					k, n := keys[rng.IntN(len(keys))], 1+rng.IntN(4)
					trace = append(trace, fmt.Sprintf("SetLimit %s %d", k, n))
					reg.SetLimit(k, n)
				}
				synctest.Wait()
				if msg := reg.servableWaiter(); msg != "" {
					t.Fatalf("seed %d, step %d:\n%s%v", seed, step, msg, trace)
				}
			}
			for _, c := range cancels {
				c()
			}
			synctest.Wait()
			for _, s := range held {
				s.Release()
			}
			for _, k := range keys {
				reg.ClearLimit(k)
			}
			if reg.Keys() != 0 {
				t.Fatalf("seed %d: %d keys left", seed, reg.Keys())
			}
		})
	}
}

// releaseAny releases one of held, picked by rng, if any (held is guarded
// by mu), and notes it in trace.
func releaseAny(rng *rand.Rand, mu *sync.Mutex, held *[]*slots.Slot, trace *[]string) {
	mu.Lock()
	var s *slots.Slot
	if len(*held) > 0 {
		i := rng.IntN(len(*held))
		s = (*held)[i]
		*held = append((*held)[:i], (*held)[i+1:]...)
	}
	mu.Unlock()
	if s != nil {
		*trace = append(*trace, "release")
		s.Release()
	}
}
