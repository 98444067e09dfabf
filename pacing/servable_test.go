package pacing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// startable describes a queued request that could start now, or returns "".
// With every event dispatching, there is none once the Gate is quiet.
func (g *Gate) startable() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.eng.Clock.Nanos()
	if nextStart(g.started, g.last, g.interval) > now || len(g.keys) > 0 && g.pickKeyLocked(now, nil, nil) == nil || g.ad.pauseUntil > now {
		return ""
	}
	msg := ""
	for c := range core.NumClasses {
		if !g.provider.CanTake(c, 1) {
			continue
		}
		for el := range g.provider.Waiters.Class(c) {
			ml := el.Value.Hold.Owner.(*grant).model
			if !ml.lane.HasRoom() || nextStart(ml.started, ml.last, ml.interval) > now {
				continue
			}
			msg += fmt.Sprintf("a class %d request for %s could start\n", c, ml.name)
		}
	}
	return msg
}

// Random requests (classes, flows, two models), releases, cancellations,
// passing time and reconfigurations with caps, pacing, key pools and
// shares, each step let to settle: no request is left queued that could
// start.
func TestNoStartableRequestLeft(t *testing.T) {
	for seed := range uint64(100) {
		testrig.Bubble(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 3))
			config := func() Config {
				return Config{
					MaxConcurrentRequests: 2 + rng.IntN(3), MaxQueue: 100, RequestsPerMinute: []int{0, 600}[rng.IntN(2)],
					Models:  map[string]ModelConfig{"m0": {MaxConcurrentRequests: 1 + rng.IntN(2), Adaptive: []*AdaptiveConfig{nil, {RetestMS: 100}}[rng.IntN(2)]}},
					APIKeys: []KeyConfig{{ID: "k1", MaxConcurrentRequests: 2}, {ID: "k2", MaxConcurrentRequests: 1 + rng.IntN(2)}}[:rng.IntN(3)],
					Shares:  map[string]ShareConfig{"interactive": {Reserved: rng.IntN(2)}, "batch": {Min: rng.IntN(3)}},
					// Learning moves the provider's (or each key's) limit as
					// time passes, from its own timers.
					Adaptive: []*AdaptiveConfig{nil, {Initial: 1 + rng.IntN(2), RetestMS: 100}}[rng.IntN(2)],
				}
			}
			g, err := NewGate("p", config())
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var held []*slots.Slot
			var cancels []context.CancelFunc
			prios := []slots.Priority{slots.PriorityInteractive, slots.PriorityDefault, slots.PriorityBatch}
			for step := range 100 {
				switch op := rng.IntN(12); {
				case op < 5:
					ctx := slots.WithFlow(slots.WithPriority(context.Background(), prios[rng.IntN(3)]), fmt.Sprint("f", rng.IntN(3)))
					ctx, cancel := context.WithCancel(ctx)
					cancels = append(cancels, cancel)
					model := []string{"m0", "m1"}[rng.IntN(2)]
					go func() {
						if gt, err := g.Acquire(ctx, model); err == nil {
							mu.Lock()
							held = append(held, gt.Slot)
							mu.Unlock()
						}
					}()
				case op < 8:
					mu.Lock()
					var s *slots.Slot
					if len(held) > 0 {
						i := rng.IntN(len(held))
						s = held[i]
						held = append(held[:i], held[i+1:]...)
					}
					mu.Unlock()
					if s != nil {
						s.Release()
					}
				case op < 9:
					if len(cancels) > 0 {
						cancels[rng.IntN(len(cancels))]()
					}
				case op < 10:
					time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond) // fake time: a start comes due
				default:
					if err := g.Reconfigure(config()); err != nil {
						t.Fatal(err)
					}
				}
				synctest.Wait()
				if msg := g.startable(); msg != "" {
					t.Fatalf("seed %d, step %d: %s", seed, step, msg)
				}
			}
			g.Close()
			for _, c := range cancels {
				c()
			}
			synctest.Wait()
			for _, s := range held {
				s.Release()
			}
			if st := g.Status(); st.InFlight != 0 || st.Queued != 0 {
				t.Fatalf("seed %d: left %+v", seed, st)
			}
		})
	}
}
