package core_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
)

// waiter returns a waiter of class c in flow id with weight wt.
func waiter(c uint8, id string, wt int32) *core.Waiter {
	w := core.NewWaiter(&core.Hold{Class: c}, 0)
	w.Place(core.Place{Flow: id, Weight: wt})
	return w
}

// serve grants the lane's next waiter into its holders and returns it.
func serve(ln *core.Lane) *core.Waiter {
	w, passed := ln.Candidate(nil)
	if w == nil {
		return nil
	}
	ln.Serve(w)
	passed.Pass(w, int64(w.Hold.Extra)+1)
	ln.Holders.Add(w.Hold, &w.Hold.Idx)
	return w
}

func release(ln *core.Lane, w *core.Waiter) {
	if !ln.Holders.Remove(w.Hold, &w.Hold.Idx) {
		panic("not a holder")
	}
}

func TestQueueFIFOInOneFlow(t *testing.T) {
	var q core.Queue
	ws := make([]*core.Waiter, 5)
	for i := range ws {
		ws[i] = waiter(core.ClassDefault, "", 0)
		q.Push(&ws[i].Elem)
	}
	assert.True(t, q.Remove(&ws[2].Elem))
	assert.False(t, q.Remove(&ws[2].Elem), "removed twice")
	var got []*core.Waiter
	for el := q.Head(core.ClassDefault); el != nil; el = q.Head(core.ClassDefault) {
		got = append(got, el.Value)
		q.Served(el)
	}
	assert.Equal(t, []*core.Waiter{ws[0], ws[1], ws[3], ws[4]}, got)
	assert.Zero(t, q.Len())
}

// Flow A queues 200, then flow B queues one: B is served within the next two
// grants.
func TestQueueFlowsTakeTurns(t *testing.T) {
	ln := core.Lane{Limit: 0}
	for range 200 {
		ln.Waiters.Push(&waiter(core.ClassDefault, "A", 1).Elem)
	}
	b := waiter(core.ClassDefault, "B", 1)
	ln.Waiters.Push(&b.Elem)
	ln.Limit = 2
	first, second := serve(&ln), serve(&ln)
	assert.Contains(t, []*core.Waiter{first, second}, b)
	assert.Equal(t, 199, ln.Waiters.FlowLen("A"))
	assert.Zero(t, ln.Waiters.FlowLen("B"))
}

// The default flow, queued before any other flow appeared, takes turns too.
func TestQueueDefaultFlowJoinsTurns(t *testing.T) {
	ln := core.Lane{}
	for range 10 {
		ln.Waiters.Push(&waiter(core.ClassDefault, "", 0).Elem)
	}
	o := waiter(core.ClassDefault, "org", 1)
	ln.Waiters.Push(&o.Elem)
	ln.Limit = 2
	assert.Equal(t, "", serve(&ln).Flow)
	assert.Same(t, o, serve(&ln))
	assert.Equal(t, 9, ln.Waiters.FlowLen(""))
}

// Weights 3:1 with both flows backlogged: the admitted ratio over 400 grants
// is within 5% of 3:1.
func TestQueueWeights(t *testing.T) {
	ln := core.Lane{}
	for range 400 {
		ln.Waiters.Push(&waiter(core.ClassDefault, "A", 3).Elem)
		ln.Waiters.Push(&waiter(core.ClassDefault, "B", 1).Elem)
	}
	ln.Limit = 1
	n := map[string]int{}
	for range 400 {
		w := serve(&ln)
		require.NotNil(t, w)
		n[w.Flow]++
		release(&ln, w)
	}
	ratio := float64(n["A"]) / float64(n["B"])
	assert.InEpsilon(t, 3.0, ratio, 0.05, "A=%d B=%d", n["A"], n["B"])
}

// With classes and no shares: the highest class with waiters goes first,
// FIFO within it.
func TestQueueClassesStrict(t *testing.T) {
	ln := core.Lane{}
	var batch []*core.Waiter
	for range 100 {
		w := waiter(core.ClassLow, "", 0)
		batch = append(batch, w)
		ln.Waiters.Push(&w.Elem)
	}
	def := waiter(core.ClassDefault, "", 0)
	ln.Waiters.Push(&def.Elem)
	hi1, hi2 := waiter(core.ClassHigh, "", 0), waiter(core.ClassHigh, "", 0)
	ln.Waiters.Push(&hi1.Elem)
	ln.Waiters.Push(&hi2.Elem)
	ln.Limit = 4
	assert.Equal(t, []*core.Waiter{hi1, hi2, def, batch[0]}, []*core.Waiter{serve(&ln), serve(&ln), serve(&ln), serve(&ln)})
	assert.Nil(t, serve(&ln), "full")
	by, top := ln.Waiters.Top(3)
	assert.Equal(t, [core.NumClasses]int{core.ClassLow: 99}, by)
	assert.Equal(t, []core.FlowCount{{Flow: "", Waiting: 99}}, top)
}

func TestQueueTop(t *testing.T) {
	var q core.Queue
	for i, id := range []string{"a", "b", "b", "c", "c", "c"} {
		c := core.ClassDefault
		if i%2 == 1 {
			c = core.ClassHigh
		}
		q.Push(&waiter(c, id, 1).Elem)
	}
	by, top := q.Top(2)
	assert.Equal(t, 3, by[core.ClassDefault])
	assert.Equal(t, 3, by[core.ClassHigh])
	assert.Equal(t, []core.FlowCount{{Flow: "c", Waiting: 3}, {Flow: "b", Waiting: 2}}, top)
}

// A minimum share: batch keeps one slot of four under sustained interactive
// load, and gets the next free slot whenever it holds none.
func TestCanTakeMinShare(t *testing.T) {
	sh := &core.Shares{}
	sh.Min[core.ClassLow] = 1
	ln := core.Lane{Limit: 4, Shares: sh}
	var held []*core.Waiter
	for range 4 { // interactive fills the lane while batch is idle: lent
		w := waiter(core.ClassHigh, "", 0)
		ln.Waiters.Push(&w.Elem)
		held = append(held, serve(&ln))
	}
	for range 50 {
		ln.Waiters.Push(&waiter(core.ClassLow, "", 0).Elem)
	}
	for range 50 {
		ln.Waiters.Push(&waiter(core.ClassHigh, "", 0).Elem)
	}
	assert.False(t, ln.CanTake(core.ClassHigh, 1))
	// Release the oldest holder each time: grants alternate as the rule says.
	var classes []uint8
	for range 12 {
		release(&ln, held[0])
		held = held[1:]
		w := serve(&ln)
		require.NotNil(t, w)
		classes = append(classes, w.Class)
		held = append(held, w)
	}
	hi, lo := core.ClassHigh, core.ClassLow
	// The first free slot goes to batch (it holds none, short of its 1);
	// then interactive until batch's holder releases, then batch again.
	assert.Equal(t, []uint8{lo, hi, hi, hi, lo, hi, hi, hi, lo, hi, hi, hi}, classes)
}

// A reserve: one of five kept for interactive even when it is idle.
func TestCanTakeReserve(t *testing.T) {
	sh := &core.Shares{}
	sh.Reserved[core.ClassHigh] = 1
	ln := core.Lane{Limit: 5, Shares: sh}
	for range 4 {
		require.True(t, ln.Admits(core.ClassLow, 1))
		ln.Holders.Add(&core.Hold{Class: core.ClassLow}, new(int32))
	}
	assert.False(t, ln.Admits(core.ClassLow, 1), "the fifth is reserved")
	assert.False(t, ln.Admits(core.ClassDefault, 1))
	assert.True(t, ln.Admits(core.ClassHigh, 1))
}

// Guarantees beyond the limit are cut from the top, and a class short of its
// guarantee is served before higher ones only within what is left: nothing
// is stuck while capacity is free and a waiter could use it.
func TestCanTakeOverCommitted(t *testing.T) {
	sh := &core.Shares{}
	sh.Reserved[core.ClassHigh] = 1
	sh.Min[core.ClassLow] = 1
	ln := core.Lane{Limit: 4, Shares: sh}
	var def []*core.Hold
	for range 3 {
		require.True(t, ln.Admits(core.ClassDefault, 1))
		h := &core.Hold{}
		def = append(def, h)
		ln.Holders.Add(h, &h.Idx)
	}
	assert.False(t, ln.Admits(core.ClassDefault, 1), "the last is reserved")
	hi, lo := waiter(core.ClassHigh, "", 0), waiter(core.ClassLow, "", 0)
	ln.Waiters.Push(&lo.Elem)
	ln.Waiters.Push(&hi.Elem)
	assert.Same(t, hi, serve(&ln), "both short; the higher first")
	assert.Nil(t, serve(&ln))
	ln.Holders.Remove(def[0], &def[0].Idx)
	assert.Same(t, lo, serve(&ln))

	// A limit of one: the reserve takes it all; batch's minimum is cut to 0.
	ln2 := core.Lane{Limit: 1, Shares: sh}
	assert.False(t, ln2.Admits(core.ClassLow, 1))
	assert.True(t, ln2.Admits(core.ClassHigh, 1))
}

// A random mix of pushes, removals and grants keeps the counts consistent
// and serves every class in order of rank when nothing holds it back.
func TestQueueRandomOps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q core.Queue
	var live []*core.Waiter
	flows := []string{"", "a", "b", "c"}
	for i := range 96 { // past maxKeptFlows, at times
		flows = append(flows, fmt.Sprint("f", i))
	}
	for range 20000 {
		switch op := rng.IntN(4); {
		case op == 0 || len(live) == 0:
			w := waiter(uint8(rng.IntN(int(core.NumClasses))), flows[rng.IntN(4+rng.IntN(2)*96)], int32(rng.IntN(4)))
			w.Cost = []int32{-5, 0, 1, 1, 2, 7, 100, math.MaxInt32}[rng.IntN(8)]
			q.Push(&w.Elem)
			live = append(live, w)
		case op == 1 || op == 2: // a waiter leaves, or is served out of turn
			i := rng.IntN(len(live))
			if op == 1 {
				require.True(t, q.Remove(&live[i].Elem))
			} else {
				require.True(t, q.Served(&live[i].Elem))
			}
			live = append(live[:i], live[i+1:]...)
		default:
			var el = q.Head(core.ClassHigh)
			for _, c := range core.Order {
				if el = q.Head(c); el != nil {
					break
				}
			}
			require.NotNil(t, el)
			for _, w := range live { // nothing of a higher class is left behind
				require.LessOrEqual(t, rank(el.Value.Class), rank(w.Class))
			}
			require.True(t, q.Served(el))
			for i, w := range live {
				if w == el.Value {
					live = append(live[:i], live[i+1:]...)
					break
				}
			}
		}
		require.Equal(t, len(live), q.Len())
		require.True(t, q.CheckFirsts(), "the first waiters' costs as counted")
		var by [core.NumClasses]int
		per := map[string]int{}
		for _, w := range live {
			by[w.Class]++
			per[w.Flow]++
		}
		for c := range core.NumClasses {
			require.Equal(t, by[c], q.ClassLen(c))
			n := 0
			for range q.Class(c) {
				n++
			}
			require.Equal(t, by[c], n)
		}
		for _, id := range flows {
			require.Equal(t, per[id], q.FlowLen(id))
		}
	}
}

func rank(c uint8) int {
	for i, d := range core.Order {
		if d == c {
			return i
		}
	}
	panic("no such class")
}

// The documented bound: the k-th waiter of a flow of weight w, among queued
// flows of total weight W, is served within ceil(k/w)*(W-w) + k grants.
func TestQueueTurnBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 2000 {
		ln := core.Lane{}
		flows := 1 + rng.IntN(6)
		weights := make([]int32, flows)
		var all [][]*core.Waiter
		W := 0
		for f := range flows {
			weights[f] = int32(1 + rng.IntN(4))
			W += int(weights[f])
			all = append(all, nil)
		}
		// Arrivals interleave the flows at random.
		for range 5 + rng.IntN(60) {
			f := rng.IntN(flows)
			w := waiter(core.ClassDefault, fmt.Sprint("f", f), weights[f])
			ln.Waiters.Push(&w.Elem)
			all[f] = append(all[f], w)
		}
		// Some grants first, so the target's flow may be mid-turn.
		ln.Limit = 1
		for range rng.IntN(5) {
			if w := serve(&ln); w != nil {
				release(&ln, w)
				for f := range all {
					if len(all[f]) > 0 && all[f][0] == w {
						all[f] = all[f][1:]
					}
				}
			}
		}
		f := rng.IntN(flows)
		if len(all[f]) == 0 {
			continue
		}
		k := 1 + rng.IntN(len(all[f]))
		target := all[f][k-1]
		wf := int(weights[f])
		bound := (k+wf-1)/wf*(W-wf) + k
		for n := 1; ; n++ {
			w := serve(&ln)
			require.NotNil(t, w)
			release(&ln, w)
			if w == target {
				require.LessOrEqual(t, n, bound, "trial %d: k=%d w=%d W=%d", trial, k, wf, W)
				break
			}
		}
	}
}

// flowsServed serves ln's next n waiters one at a time (each released at
// once) and returns their flows' names in order.
func flowsServed(t *testing.T, ln *core.Lane, n int) string {
	t.Helper()
	var got string
	for range n {
		w := serve(ln)
		require.NotNil(t, w)
		got += w.Flow
		release(ln, w)
	}
	return got
}

// heavyWaiter returns a waiter of the default class in flow id with weight
// wt, weighing units.
func heavyWaiter(id string, wt int32, units int) *core.Waiter {
	w := core.NewWaiter(&core.Hold{Extra: int32(units - 1)}, 0)
	w.Place(core.Place{Flow: id, Weight: wt})
	return w
}

// Flows take turns in units, not grants: a flow of heavy waiters and one of
// light waiters, both backlogged, are granted units in proportion to their
// weights, so the light flow gets many more grants.
func TestQueueTurnsInUnits(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		heavy, light             int   // each flow's waiters' units
		heavyWeight, lightWeight int32 // the flows' weights
	}{
		{"equal weights", 100, 1, 1, 1},
		{"heavy weighs 3", 40, 3, 3, 1},
		{"light weighs 2", 500, 7, 1, 2},
		{"both heavy", 64, 16, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := core.Lane{}
			for range 2000 {
				ln.Waiters.Push(&heavyWaiter("H", tc.heavyWeight, tc.heavy).Elem)
			}
			for range 20000 {
				ln.Waiters.Push(&heavyWaiter("L", tc.lightWeight, tc.light).Elem)
			}
			ln.Limit = tc.heavy
			units := map[string]int{}
			for range 3000 { // both flows stay backlogged throughout
				w := serve(&ln)
				require.NotNil(t, w)
				units[w.Flow] += w.Hold.Units()
				release(&ln, w)
			}
			require.Positive(t, ln.Waiters.FlowLen("H"))
			require.Positive(t, ln.Waiters.FlowLen("L"))
			want := float64(tc.heavyWeight) / float64(tc.lightWeight)
			got := float64(units["H"]) / float64(units["L"])
			assert.InEpsilon(t, want, got, 0.05, "units H=%d L=%d", units["H"], units["L"])
		})
	}
}

// A flow whose next waiter is heavier than what is left of its turn ends
// its turn, also when the waiter before it left without a grant: the turn
// passes to the other flow instead of overdrawing.
func TestQueueTurnEndsAtAHeavierWaiter(t *testing.T) {
	ln := core.Lane{Limit: 120}
	a1, a2, a3 := heavyWaiter("A", 1, 10), heavyWaiter("A", 1, 10), heavyWaiter("A", 1, 120)
	b1 := heavyWaiter("B", 1, 1)
	for _, w := range []*core.Waiter{a1, a2, a3, b1} {
		ln.Waiters.Push(&w.Elem)
	}
	// A's turn is worth 128 units (120, the heaviest, rounded up to a
	// power of 2): a1 takes 10 of them.
	require.Same(t, a1, serve(&ln))
	release(&ln, a1)
	// a2 leaves: a3 (120) does not fit the 118 left, so B goes next.
	require.True(t, ln.Waiters.Remove(&a2.Elem))
	require.Same(t, b1, serve(&ln))
	release(&ln, b1)
	// A's next turn adds 128 to the 118 it carried: a3 goes.
	require.Same(t, a3, serve(&ln))
}

// A turn ends when what is left of it does not cover the flow's next
// waiter, also when the waiter that left was light: A's turn of 16 serves
// 5 (11 left), then 1 leaves and A's next waiter costs 12, so B goes.
func TestQueueTurnEndsAfterALeaver(t *testing.T) {
	ln := core.Lane{Limit: 15}
	a1, a2, a3 := heavyWaiter("A", 1, 5), heavyWaiter("A", 1, 1), heavyWaiter("A", 1, 12)
	b1, b2 := heavyWaiter("B", 1, 10), heavyWaiter("B", 1, 10)
	for _, w := range []*core.Waiter{a1, a2, a3, b1, b2} {
		ln.Waiters.Push(&w.Elem)
	}
	require.Same(t, a1, serve(&ln))
	release(&ln, a1)
	require.True(t, ln.Waiters.Remove(&a2.Elem))
	assert.Same(t, b1, serve(&ln))
}

// Waiters of one unit take turns as before units counted: a flow of weight
// w is granted w in a row.
func TestQueueTurnsOfOneUnit(t *testing.T) {
	ln := core.Lane{}
	for range 6 {
		ln.Waiters.Push(&waiter(core.ClassDefault, "A", 3).Elem)
		ln.Waiters.Push(&waiter(core.ClassDefault, "B", 1).Elem)
	}
	ln.Limit = 1
	assert.Equal(t, "AAABAAAB", flowsServed(t, &ln, 8))
}

// What a turn leaves carries to the flow's next turn: flow A's waiters
// cost 6 and B's 15, so a turn is worth 16; A's first turn takes two (4
// left), its second 4+16, three. Without the carry, A would get two a
// turn, 12 units to B's 15.
func TestQueueTurnsCarryOver(t *testing.T) {
	ln := core.Lane{}
	for range 10 {
		ln.Waiters.Push(&heavyWaiter("A", 1, 6).Elem)
		ln.Waiters.Push(&heavyWaiter("B", 1, 15).Elem)
	}
	ln.Limit = 15
	assert.Equal(t, "AABAAAB", flowsServed(t, &ln, 7))
}

// A turn is worth what the waiters queued now in its class cost, not what
// a waiter that left, or one of another class, cost: flows of one unit
// alternate again.
func TestQueueTurnsAfterAHeavyWaiter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		class uint8
		stays bool
	}{
		{"left", core.ClassDefault, false},
		{"in another class", core.ClassLow, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := core.Lane{}
			for range 50 {
				ln.Waiters.Push(&heavyWaiter("A", 1, 1).Elem)
				ln.Waiters.Push(&heavyWaiter("B", 1, 1).Elem)
			}
			c := core.NewWaiter(&core.Hold{Class: tc.class, Extra: 999}, 0)
			c.Place(core.Place{Flow: "C", Weight: 1})
			ln.Waiters.Push(&c.Elem)
			if !tc.stays {
				require.True(t, ln.Waiters.Remove(&c.Elem))
			}
			ln.Limit = 1
			assert.Equal(t, "ABABABAB", flowsServed(t, &ln, 8))
		})
	}
}

// With many flows, each still shares units by weight: 70 flows of one unit
// and one of 100, all backlogged, are each granted within a turn's worth
// of the same units over three rounds, whichever place in turn they have.
func TestQueueManyFlowsShareUnits(t *testing.T) {
	ln := core.Lane{}
	for range 400 {
		for f := range 70 {
			ln.Waiters.Push(&heavyWaiter(fmt.Sprint("L", f), 1, 1).Elem)
		}
	}
	for range 10 {
		ln.Waiters.Push(&heavyWaiter("H", 1, 100).Elem)
	}
	ln.Limit = 100
	units := map[string]int{}
	for range 3 * 70 * 128 {
		w := serve(&ln)
		require.NotNil(t, w)
		units[w.Flow] += int(w.Cost)
		release(&ln, w)
	}
	lo, hi := math.MaxInt, 0
	for _, n := range units {
		lo, hi = min(lo, n), max(hi, n)
	}
	require.Len(t, units, 71)
	assert.LessOrEqual(t, hi-lo, 2*128, "units per flow from %d to %d", lo, hi)
}
