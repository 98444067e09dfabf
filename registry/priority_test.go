package registry_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

var (
	interactive = slots.WithPriority(context.Background(), slots.PriorityInteractive)
	batch       = slots.WithPriority(context.Background(), slots.PriorityBatch)
)

func acquirer(r *registry.Registry[string], keys ...string) func(context.Context) (*slots.Slot, error) {
	return func(ctx context.Context) (*slots.Slot, error) { return r.AcquireAll(ctx, keys...) }
}

// Cap 4 saturated by batch with 100 batch waiters queued: an interactive
// request is admitted at the next release, on one key and through
// AcquireAll (provider cap 4, model caps 4).
func TestRegistryInteractiveJumpsBatch(t *testing.T) {
	for name, keys := range map[string][]string{"one key": {"p"}, "AcquireAll": {"p", "m"}} {
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				reg := registry.New[string](4)
				batchRig := testrig.New(t, acquirer(reg, keys...))
				for range 104 {
					batchRig.Add(batch, "batch")
				}
				// The interactive request needs another model, so that in
				// the AcquireAll case it competes for the provider alone.
				ikeys := keys
				if len(keys) > 1 {
					ikeys = []string{"p", "m2"}
				}
				iRig := testrig.New(t, acquirer(reg, ikeys...))
				iRig.Add(interactive, "interactive")
				q := reg.Queue("p")
				assert.Equal(t, 100, q.Batch)
				assert.Equal(t, 1, q.Interactive)

				batchRig.ReleaseOldest()
				assert.Equal(t, []string{"interactive"}, iRig.Order(), "admitted at the next release")
				assert.Len(t, batchRig.Order(), 4)
				iRig.ReleaseAll()
				batchRig.ReleaseAll()
				assert.Zero(t, reg.Keys())
			})
		})
	}
}

// A flow's backlog does not hold back another flow on the same key, also
// when the requests need several keys.
func TestRegistryFlowsTakeTurns(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](1)
		r := testrig.New(t, acquirer(reg, "p", "m"))
		a := slots.WithFlow(context.Background(), "A")
		for range 201 {
			r.Add(a, "A")
		}
		r.Add(slots.WithFlow(context.Background(), "B"), "B")
		assert.Equal(t, []slots.FlowStat{{Flow: "A", Waiting: 200}, {Flow: "B", Waiting: 1}}, reg.Queue("m").TopFlows)
		r.ReleaseOldest()
		r.ReleaseOldest()
		assert.Contains(t, r.Order()[1:3], "B")
		r.ReleaseAll()
		assert.Zero(t, reg.Keys())
	})
}

func TestRegistryFlowWeights(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](1)
		r := testrig.New(t, acquirer(reg, "k"))
		r.CheckWeights(slots.WithFlowWeight(context.Background(), "A", 3), slots.WithFlowWeight(context.Background(), "B", 1))
		r.ReleaseAll()
		assert.Zero(t, reg.Keys())
	})
}

// A batch minimum share of 1 on every key: under sustained interactive load
// batch gets one grant in four (holds of equal length), on one key and
// through AcquireAll.
func TestRegistryBatchMinShare(t *testing.T) {
	for name, keys := range map[string][]string{"one key": {"p"}, "AcquireAll": {"p", "m"}} {
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				reg := registry.New[string](4, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
				r := testrig.New(t, acquirer(reg, keys...))
				r.CheckMinShare(interactive, batch)
				r.ReleaseAll()
				assert.Zero(t, reg.Keys())
			})
		})
	}
}

func TestRegistryReserveAndFlowQueue(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](3,
			slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 1}),
			slots.WithMaxQueuePerFlow(1))
		var held []*slots.Slot
		for range 2 {
			s, err := reg.TryAcquire("k")
			require.NoError(t, err)
			held = append(held, s)
		}
		_, err := reg.TryAcquire("k")
		assert.ErrorIs(t, err, slots.ErrLimitReached, "the third is reserved")
		_, err = reg.TryAcquireAll("k", "other")
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		s, err := reg.AcquireAll(interactive, "k", "other")
		require.NoError(t, err, "interactive takes the reserve")
		held = append(held, s)

		r := testrig.New(t, acquirer(reg, "k"))
		r.Add(slots.WithFlow(context.Background(), "A"), "A")
		r.Add(slots.WithFlow(context.Background(), "A"), "A")
		r.Add(slots.WithFlow(context.Background(), "B"), "B")
		require.Len(t, r.Errs(), 1)
		assert.ErrorIs(t, r.Errs()[0], slots.ErrQueueFull, "A's second waiter")
		assert.Equal(t, 2, reg.Waiting("k"))
		for _, s := range held {
			s.Release()
			synctest.Wait() // each grant lands before the next
		}
		r.ReleaseAll()
		assert.Equal(t, []string{"A", "B"}, r.Order())
		assert.Zero(t, reg.Keys())
	})
}

// Random classes, flows, weights, cancellations and limit changes, on single
// keys and on AcquireAll over a provider and two models, with shares: no
// key's cap is exceeded at any instant (an independent count per key), every
// caller ends admitted or cancelled, and no key is left.
func TestRegistryPriorityHammer(t *testing.T) {
	reg := registry.New[string](3,
		slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}),
		slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 1}))
	var mu sync.Mutex
	inFlight := map[string]int{}
	maxLimit := map[string]int{"p": 3, "m0": 3, "m1": 3}
	var admitted, canceled int
	prios := []slots.Priority{slots.PriorityInteractive, slots.PriorityDefault, slots.PriorityBatch}
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			for i := range 60 {
				ctx := slots.WithPriority(context.Background(), prios[(g+i)%3])
				ctx = slots.WithFlowWeight(ctx, fmt.Sprint("org", (g*5+i)%4), 1+i%2)
				cancel := context.CancelFunc(func() {})
				if i%5 == 0 {
					ctx, cancel = context.WithCancel(ctx)
					go cancel()
				}
				if g == 0 && i%8 == 0 {
					n := 2 + i%4
					mu.Lock()
					maxLimit["p"] = max(maxLimit["p"], n)
					mu.Unlock()
					reg.SetLimit("p", n)
				}
				keys := []string{"p", fmt.Sprint("m", i%2)}
				if i%3 == 0 {
					keys = keys[1:]
				}
				s, err := reg.AcquireAll(ctx, keys...)
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error: %v", err)
					}
					mu.Lock()
					canceled++
					mu.Unlock()
					continue
				}
				mu.Lock()
				admitted++
				for _, k := range keys {
					if inFlight[k]++; inFlight[k] > maxLimit[k] {
						t.Errorf("key %s: %d in flight, over every limit set (%d)", k, inFlight[k], maxLimit[k])
					}
				}
				mu.Unlock()
				runtime.Gosched()
				mu.Lock()
				for _, k := range keys {
					inFlight[k]--
				}
				mu.Unlock()
				s.Release()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 32*60, admitted+canceled)
	assert.NotZero(t, admitted)
	reg.ClearLimit("p")
	assert.Zero(t, reg.Keys())
	assert.Zero(t, reg.Stats().InFlight)
}

// A batch waiter on A and C granted through A's release leaves C's queue;
// batch then stops keeping its Min on C, and the default waiter on C, which
// could now take C's free slot, is served in the same pass (no newcomer
// passes it).
func TestRegistryMultiGrantServesTheOtherKeys(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		reg := registry.New[string](2, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 2}))
		reg.SetLimit("A", 1)
		a, err := reg.TryAcquire("A")
		require.NoError(t, err)
		w := testrig.New(t, acquirer(reg, "A", "C"))
		w.Add(batch, "W") // A is full: W waits on A and C
		d := testrig.New(t, acquirer(reg, "C"))
		d.Add(context.Background(), "D") // C keeps batch's Min 2 while W waits
		require.Equal(t, 2, reg.Waiting("C"))

		a.Release()
		synctest.Wait()
		assert.Equal(t, []string{"W"}, w.Order())
		assert.Equal(t, []string{"D"}, d.Order(), "D takes C's free slot")
		_, err = reg.TryAcquire("C")
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		w.ReleaseAll()
		d.ReleaseAll()
		assert.Zero(t, reg.Keys())
	})
}
