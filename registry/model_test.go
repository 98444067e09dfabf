package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// modelSeeds is how many seeds each option set runs: 2 to 3 s in all on
// two cores, 15 to 20 s with the race detector.
const modelSeeds = 100

// A model of the registry run in virtual time: random SetLimit, ClearLimit
// and LimitFunc changes (refreshed by time and RefreshLimits), AcquireN,
// AcquireAllN over two or three keys, TryAcquireN, cancellations (some in
// the same step as a release, so that a grant and the cancellation race),
// releases and sleeps, under each option set. After every step, settled,
// it checks what the registry promises:
//
//   - no leak: each key's InFlight is the units of the slots the model holds
//     under it (a bypassed slot holds none). A refusal, an expiry or a
//     cancellation, also one that raced a grant, leaves nothing behind;
//   - no overfill: no key holds more than the limit in force, or than what
//     it held before the step less what was released in it. Lowering a
//     limit takes no units back, but nothing is admitted above it;
//   - no stranding: a waiter is not left queued while each of its keys has
//     room for every caller waiting there, nor while nothing is held at
//     all and its units fit its keys' limits; without classes or flows
//     the first waiter of a key that only single-key callers wait on is
//     served once its units fit. Every change that frees room (a release,
//     a raised limit, a withdrawal) serves the queue;
//   - a clean finish: once every waiter is cancelled and every slot
//     released, the registry holds nothing, queues no one and tracks no key.
func TestRegistryModelNeverLeaksOverfillsOrStrands(t *testing.T) {
	observer := slots.WithObserver(slots.ObserverFunc(func(slots.Event) {}))
	shares := []registry.Option{slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}),
		slots.WithShare(slots.PriorityInteractive, slots.Share{Min: 1})}
	for _, set := range []modelSet{
		{name: "plain", inOrder: true},
		{name: "classes", places: true},
		{name: "max wait", opts: []registry.Option{slots.WithMaxWait(10 * time.Millisecond)}, inOrder: true},
		{name: "max queue", opts: []registry.Option{slots.WithMaxQueue(2)}, places: true},
		{name: "shares", opts: shares, places: true, shares: true},
		{name: "limit func", limitFunc: true},
		{name: "limit func classes", limitFunc: true, places: true},
		{name: "fail open", opts: []registry.Option{slots.WithMaxWait(10 * time.Millisecond), slots.WithFailOpen()}},
		{name: "leak detection", opts: []registry.Option{slots.WithMaxWait(10 * time.Millisecond), slots.WithLeakDetection()}},
		{name: "max queue per flow", opts: []registry.Option{slots.WithMaxQueuePerFlow(1)}, places: true},
		{name: "observer", opts: []registry.Option{observer, slots.WithMaxWait(10 * time.Millisecond)}},
	} {
		t.Run(set.name, func(t *testing.T) {
			for seed := range uint64(modelSeeds) {
				if !t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
					testrig.Bubble(t, func(t *testing.T) { runModel(t, set, seed, 300) })
				}) {
					return // one failing seed's trace is enough
				}
			}
		})
	}
}

// modelSet is an option set the model runs under.
type modelSet struct {
	name      string
	opts      []registry.Option
	places    bool // callers get random priority classes and flows
	limitFunc bool // limits come from a LimitFunc as well as SetLimit
	shares    bool // shares keep units for classes: no stranding checks
	inOrder   bool // one FIFO queue per key: its first waiter is checked too
}

// modelCaller is a caller the model made, and what it got.
type modelCaller struct {
	id     int
	keys   []string
	n      int
	cancel context.CancelFunc // nil for TryAcquireN
	slot   *slots.Slot        // held until the model releases it
	done   bool               // returned, admitted or not
}

type modelResult struct {
	c    *modelCaller
	slot *slots.Slot
	err  error
}

const modelDefault = 3 // every key's default limit

func runModel(t *testing.T, set modelSet, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	keys := []string{"a", "b", "c"}
	opts := append([]registry.Option{registry.WithShards(2), slots.WithLogger(slog.New(slog.DiscardHandler))}, set.opts...)
	var sourceMu sync.Mutex // guards source and sourceMode: what the LimitFunc returns
	source := map[string]int{"a": modelDefault, "b": modelDefault, "c": modelDefault}
	sourceMode := 0 // it answers (0), fails (1) or panics (2)
	reg := registry.New[string](modelDefault, opts...)
	if set.limitFunc {
		reg = registry.NewWithLimitFunc[string](modelDefault, func(_ context.Context, k string) (int, error) {
			sourceMu.Lock()
			defer sourceMu.Unlock()
			switch sourceMode {
			case 1:
				return 0, errors.New("down")
			case 2:
				panic("boom")
			}
			return source[k], nil
		}, time.Millisecond, opts...)
	}
	limit := maps.Clone(source) // the limit in force, as the model knows it
	held := map[string]int{}    // InFlight after the last step
	var callers []*modelCaller
	results := make(chan modelResult, steps)
	cancelAll := func() {
		for _, c := range callers {
			if c.cancel != nil {
				c.cancel()
			}
		}
	}
	t.Cleanup(cancelAll) // also after a failure, for the bubble to end
	var trace []string
	logf := func(format string, a ...any) { trace = append(trace, fmt.Sprintf(format, a...)) }
	fail := func(format string, a ...any) {
		t.Helper()
		for _, l := range trace {
			t.Log(l)
		}
		t.Fatalf(format, a...)
	}
	state := func() string {
		s := ""
		for _, k := range keys {
			s += fmt.Sprintf(" %s: %d held of %d, %d waiting;", k, reg.InFlight(k), reg.Limit(k), reg.Waiting(k))
		}
		return s
	}
	pick := func(match func(*modelCaller) bool) *modelCaller { // a random one that matches, or nil
		cs := slices.DeleteFunc(slices.Clone(callers), func(c *modelCaller) bool { return !match(c) })
		if len(cs) == 0 {
			return nil
		}
		return cs[rng.IntN(len(cs))]
	}
	spawn := func(ks []string, n int) {
		c := &modelCaller{id: len(callers), keys: ks, n: n}
		ctx, cancel := context.WithCancel(context.Background())
		c.cancel = cancel
		place := ""
		if set.places {
			ctx = slots.WithPriority(ctx, slots.Priority(rng.IntN(3)-1))
			if rng.IntN(2) == 0 {
				ctx = slots.WithFlow(ctx, fmt.Sprint("f", rng.IntN(2)))
			}
			flow, _ := slots.FlowFrom(ctx)
			place = fmt.Sprintf(" %v flow %q", slots.PriorityFrom(ctx), flow)
		}
		callers = append(callers, c)
		logf("#%d acquires %d of %v%s", c.id, n, ks, place)
		go func() {
			var s *slots.Slot
			var err error
			if len(ks) == 1 {
				s, err = reg.AcquireN(ctx, ks[0], n)
			} else {
				s, err = reg.AcquireAllN(ctx, n, ks...)
			}
			results <- modelResult{c, s, err}
		}()
	}
	for step := range steps {
		released := map[string]int{}
		release := func(c *modelCaller) {
			logf("#%d releases", c.id)
			for _, k := range c.keys {
				if holding(c) {
					released[k] += c.n
				}
			}
			c.slot.Release()
			c.slot = nil
		}
		k := keys[rng.IntN(len(keys))]
		switch op := rng.IntN(11); op {
		case 0:
			n := rng.IntN(8)
			if set.limitFunc && rng.IntN(2) == 0 {
				sourceMu.Lock()
				source[k], sourceMode = max(n, 1), max(rng.IntN(5)-2, 0)
				logf("source: %s %d, mode %d", k, source[k], sourceMode)
				sourceMu.Unlock()
				if rng.IntN(2) == 0 {
					reg.RefreshLimits(func(string) bool { return true })
					logf("RefreshLimits")
				}
				break
			}
			reg.SetLimit(k, n)
			limit[k] = n
			logf("SetLimit %s %d", k, n)
		case 1:
			reg.ClearLimit(k)
			limit[k] = modelDefault
			logf("ClearLimit %s", k)
		case 2, 3:
			spawn([]string{k}, 1+rng.IntN(3))
		case 4:
			ks := slices.Clone(keys)
			rng.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
			if rng.IntN(3) != 0 {
				ks = ks[:2]
			}
			spawn(ks, 1+rng.IntN(3))
		case 5:
			if c := pick(waiting); c != nil {
				logf("#%d cancels", c.id)
				c.cancel()
			}
		case 6, 7:
			if c := pick(func(c *modelCaller) bool { return c.slot != nil }); c != nil {
				release(c)
			}
		case 8:
			n := 1 + rng.IntN(2)
			s, err := reg.TryAcquireN(k, n)
			logf("TryAcquireN %s %d: %v", k, n, err)
			if err == nil {
				callers = append(callers, &modelCaller{id: len(callers), keys: []string{k}, n: n, slot: s, done: true})
			}
		case 9:
			d := time.Duration(rng.IntN(8)) * time.Millisecond
			logf("sleep %v", d)
			time.Sleep(d)
		case 10:
			// A release and the cancellation of a waiter on one of its keys,
			// unsettled in between: the release may grant that waiter.
			if c := pick(func(c *modelCaller) bool { return c.slot != nil }); c != nil {
				ks := c.keys
				release(c)
				if w := pick(func(w *modelCaller) bool {
					return waiting(w) && slices.ContainsFunc(ks, func(k string) bool { return slices.Contains(w.keys, k) })
				}); w != nil {
					logf("#%d cancels", w.id)
					w.cancel()
				}
			}
		}
		synctest.Wait()
		for len(results) > 0 {
			r := <-results
			r.c.done, r.c.slot = true, r.slot
			logf("  #%d returns: %v", r.c.id, r.err)
		}
		before := maps.Clone(limit)
		if set.limitFunc {
			for _, k := range keys {
				limit[k] = reg.Limit(k)
			}
		}
		for _, k := range keys {
			in := reg.InFlight(k)
			if want := unitsOn(callers, k, holding); in != want {
				fail("step %d: leak: key %s holds %d units, its slots %d:%s", step, k, in, want, state())
			}
			if lim := reg.Limit(k); lim != limit[k] { // with a LimitFunc, read above
				fail("step %d: key %s has limit %d, set %d:%s", step, k, lim, limit[k], state())
			}
			bound := max(limit[k], held[k]-released[k])
			if set.limitFunc {
				bound = max(bound, before[k]) // a fetch in the step may have lowered it
			}
			if in > bound {
				fail("step %d: overfill: key %s holds %d units over its limit %d (held %d, %d released):%s",
					step, k, in, limit[k], held[k], released[k], state())
			}
			held[k] = in
		}
		if !set.shares {
			if msg := stranded(keys, limit, callers, set.inOrder); msg != "" {
				fail("step %d: stranded: %s:%s", step, msg, state())
			}
		}
	}
	cancelAll()
	synctest.Wait()
	for len(results) > 0 {
		r := <-results
		r.c.slot = r.slot
	}
	for _, c := range callers {
		if c.slot != nil {
			c.slot.Release()
		}
	}
	if st := reg.Stats(); st.InFlight != 0 || st.Waiting != 0 || st.Keys != 0 {
		fail("at the end: %d units held, %d waiting, %d keys tracked", st.InFlight, st.Waiting, st.Keys)
	}
}

// stranded describes a waiter left queued though it could be served (see
// TestRegistryModelNeverLeaksOverfillsOrStrands), or returns "".
func stranded(keys []string, limit map[string]int, callers []*modelCaller, inOrder bool) string {
	total := 0
	for _, k := range keys {
		total += unitsOn(callers, k, holding)
	}
	for _, c := range callers {
		if c.done {
			continue
		}
		roomForAll, fits := true, true
		for _, k := range c.keys {
			roomForAll = roomForAll && limit[k]-unitsOn(callers, k, holding) >= unitsOn(callers, k, waiting)
			fits = fits && c.n <= limit[k]
		}
		if roomForAll {
			return fmt.Sprintf("#%d (%d of %v) waits, its keys have room for every waiter", c.id, c.n, c.keys)
		}
		if total == 0 && fits {
			return fmt.Sprintf("#%d (%d of %v) waits, nothing is held", c.id, c.n, c.keys)
		}
	}
	for _, k := range keys {
		if !inOrder || slices.ContainsFunc(callers, func(c *modelCaller) bool {
			return waiting(c) && len(c.keys) > 1 && slices.Contains(c.keys, k)
		}) {
			continue // its order is not arrival, or a multi-key waiter may keep room
		}
		i := slices.IndexFunc(callers, func(c *modelCaller) bool { return waiting(c) && slices.Contains(c.keys, k) })
		if i >= 0 && callers[i].n <= limit[k]-unitsOn(callers, k, holding) {
			return fmt.Sprintf("#%d, first in %s's queue, fits (%d units) but waits", callers[i].id, k, callers[i].n)
		}
	}
	return ""
}

// unitsOn sums the units on k of the callers that match.
func unitsOn(callers []*modelCaller, k string, match func(*modelCaller) bool) int {
	s := 0
	for _, c := range callers {
		if match(c) && slices.Contains(c.keys, k) {
			s += c.n
		}
	}
	return s
}

// holding reports whether c holds units: a bypassed slot holds none.
func holding(c *modelCaller) bool { return c.slot != nil && !c.slot.Bypassed() }

func waiting(c *modelCaller) bool { return !c.done }
