package core

import (
	"cmp"
	"iter"
	"math/bits"
	"slices"

	"github.com/inflight-go/inflight/internal/ilist"
)

// Classes of waiters. The zero class is the default, so that a Hold or a
// Waiter nobody classified is in it; Order lists them highest first.
const (
	ClassDefault uint8 = iota
	ClassHigh          // interactive
	ClassLow           // batch
	NumClasses
)

// Order is the classes from highest to lowest priority.
var Order = [NumClasses]uint8{ClassHigh, ClassDefault, ClassLow}

// rank is a class's place in Order: lower is served first.
var rank = [NumClasses]uint8{ClassHigh: 0, ClassDefault: 1, ClassLow: 2}

// ClassOf maps a priority (slots.Priority: above 0 interactive, below 0
// batch) to its class.
func ClassOf(p int8) uint8 {
	switch {
	case p > 0:
		return ClassHigh
	case p < 0:
		return ClassLow
	}
	return ClassDefault
}

// Rank returns c's place in Order: a lower rank is served first.
func Rank(c uint8) uint8 { return rank[c] }

// Queue holds a lane's waiters in the order they are to be served: the
// highest class first; within a class, flows take turns (deficit round
// robin over each flow's weight, in units); within a flow, arrival order.
//
// A turn is worth the Weight of the waiter that starts it (so one that
// left without a grant weighs nothing) times the highest Cost (units) of the
// flows' first waiters, rounded up to a power of 2, and a grant charges
// its Cost: flows share units, not grants, by weight. What a turn leaves
// (less than the flow's next waiter) carries over while the flow waits.
// At one unit each, a turn is weight grants.
//
// While every waiter is of the default class and the default flow with
// weight 1, which is the common case, it is one FIFO list and costs what a
// list costs; the first other waiter turns the turn-taking on until the
// queue is empty again.
// The zero value is empty. Use it under its owner's lock.
type Queue struct {
	n int
	// heavy counts the waiters weighing more than one unit, and extra the
	// units they weigh beyond one each, per class.
	heavy [NumClasses]int32
	extra [NumClasses]int
	mixed bool // a waiter outside the default flow (or weighing more) came since the queue was last empty
	def   flow // the default class's default flow
	x     *sched
}

type flow struct {
	waiters ilist.List[*Waiter]
	link    ilist.Elem[*flow] // in its class's ring while it has waiters
	key     flowKey
	inTurn  bool  // its turn is under way
	credit  int64 // units left in its turn, or carried to its next
}

type flowKey struct {
	class uint8
	id    string
}

// sched is the turn-taking state, allocated the first time a queue mixes.
type sched struct {
	rings [NumClasses]ilist.List[*flow] // flows with waiters, in turn order
	count [NumClasses]int               // waiters per class
	// costs counts the flows of each class whose first waiter's Cost is
	// more than 1 by the power of 2 at or above it; bits has a bit set for
	// each count above 0.
	costs [NumClasses][32]int32
	bits  [NumClasses]uint32
	flows map[flowKey]*flow // flows other than def, while they have waiters
	peak  int               // most flows at once since allocated
	spare []*flow
}

// maxSpareFlows bounds the flow records kept for reuse; a queue that has had
// more than maxKeptFlows flows at once drops its turn-taking state (and its
// map) when it empties.
const (
	maxSpareFlows = 16
	maxKeptFlows  = 64
)

// Len returns the number of waiters.
func (q *Queue) Len() int { return q.n }

// Units returns the units the waiters weigh together.
func (q *Queue) Units() int { return q.n + q.extra[0] + q.extra[1] + q.extra[2] }

// ClassUnits returns the units the waiters of class c weigh together.
func (q *Queue) ClassUnits(c uint8) int { return q.ClassLen(c) + q.extra[c] }

// Heavy returns the number of waiters weighing more than one unit.
func (q *Queue) Heavy() int { return int(q.heavy[0] + q.heavy[1] + q.heavy[2]) }

// ClassLen returns the number of waiters of class c.
func (q *Queue) ClassLen(c uint8) int {
	if !q.mixed {
		if c == ClassDefault {
			return q.n
		}
		return 0
	}
	return q.x.count[c]
}

// FlowLen returns the number of waiters of flow id, over all classes.
func (q *Queue) FlowLen(id string) int {
	if !q.mixed {
		if id == "" {
			return q.n
		}
		return 0
	}
	n := 0
	for c := range NumClasses {
		if f := q.lookup(flowKey{c, id}); f != nil {
			n += f.waiters.Len()
		}
	}
	return n
}

func (q *Queue) lookup(k flowKey) *flow {
	if k == (flowKey{}) {
		return &q.def
	}
	return q.x.flows[k]
}

// Push queues el's waiter at the back of its flow, by its Class, Flow and
// Weight.
func (q *Queue) Push(el *ilist.Elem[*Waiter]) {
	w := el.Value
	w.Cost = max(w.Cost, 1) // a grant charges its turn something
	q.n++
	if w.Hold.Extra != 0 {
		q.heavy[w.Class]++
		q.extra[w.Class] += int(w.Hold.Extra)
	}
	if !q.mixed {
		if w.Class == ClassDefault && w.Flow == "" && w.Weight <= 1 {
			q.def.waiters.PushBack(el)
			return
		}
		q.mix()
	}
	k := flowKey{w.Class, w.Flow}
	f := q.lookup(k)
	if f == nil { // a new flow, on a spare record if one is kept
		if n := len(q.x.spare); n > 0 {
			f = q.x.spare[n-1]
			q.x.spare = q.x.spare[:n-1]
		} else {
			f = new(flow)
			f.link.Value = f
		}
		f.key = k
		q.x.flows[k] = f
		q.x.peak = max(q.x.peak, len(q.x.flows))
	}
	if f.waiters.Len() == 0 {
		f.credit, f.inTurn = 0, false
		q.x.rings[k.class].PushBack(&f.link)
		q.x.counted(k.class, w.Cost, 1) // its first waiter
	}
	f.waiters.PushBack(el)
	q.x.count[k.class]++
}

// mix turns turn-taking on: the default flow's waiters become one flow
// among others.
func (q *Queue) mix() {
	if q.x == nil {
		q.x = &sched{flows: map[flowKey]*flow{}}
		q.def.link.Value = &q.def
	}
	q.mixed = true
	q.def.credit, q.def.inTurn = 0, false
	if el := q.def.waiters.Front(); el != nil {
		q.x.rings[ClassDefault].PushBack(&q.def.link)
		q.x.count[ClassDefault] = q.def.waiters.Len()
		q.x.counted(ClassDefault, el.Value.Cost, 1)
	}
}

// Remove unlinks el (a waiter leaving without a grant) and reports whether
// it was queued here.
func (q *Queue) Remove(el *ilist.Elem[*Waiter]) bool { return q.take(el, false) }

// Beside queues w, a newcomer that cannot be admitted now and was refused
// for reason (nil: none). Beside a heavy waiter a newcomer queues even
// where it might be served (a higher class, shares: Lane.Admits), so grant
// serves the queue, in order, before a bound on it (reason) turns the
// newcomer away. It reports whether w waits, or was granted at once; if
// not, w has left the queue again, and grant has served what its leaving
// lets in (its class no longer waits).
func (q *Queue) Beside(w *Waiter, reason error, grant func()) bool {
	q.Push(&w.Elem)
	if q.Heavy() > 0 {
		grant()
	}
	if reason == nil || w.State == Granted {
		return true
	}
	q.Remove(&w.Elem)
	w.State = Gone
	grant()
	return false
}

// Served unlinks el, a waiter granted now, charging its flow's turn.
func (q *Queue) Served(el *ilist.Elem[*Waiter]) bool { return q.take(el, true) }

func (q *Queue) take(el *ilist.Elem[*Waiter], charge bool) bool {
	w := el.Value
	f := &q.def
	if q.mixed {
		if fe := q.x.rings[w.Class].Front(); fe != nil && fe.Value.waiters.Front() == el {
			f = fe.Value // the usual case: the waiter Head returned
		} else if f = q.lookup(flowKey{w.Class, w.Flow}); f == nil {
			return false
		}
	}
	first := f.waiters.Front() == el
	if !f.waiters.Remove(el) {
		return false
	}
	q.n--
	if w.Hold.Extra != 0 {
		q.heavy[w.Class]--
		q.extra[w.Class] -= int(w.Hold.Extra)
	}
	if !q.mixed {
		return true
	}
	c := f.key.class
	q.x.count[c]--
	ring := &q.x.rings[c]
	if f.waiters.Len() == 0 {
		ring.Remove(&f.link)
		f.credit, f.inTurn = 0, false
		if f != &q.def {
			delete(q.x.flows, f.key)
			f.key = flowKey{}
			if len(q.x.spare) < maxSpareFlows {
				q.x.spare = append(q.x.spare, f)
			}
		}
	} else {
		if charge && !f.inTurn {
			// Its turn starts, weighted by the waiter served, and worth per
			// weight at least that waiter's Cost and at least the Cost of
			// the first waiter of every flow of c, rounded up to a power of
			// 2 (0 if none): a turn covers its first grant, and flows'
			// turns are worth alike.
			quantum := max(int64(w.Cost), int64(1)<<bits.Len32(q.x.bits[c])>>1)
			f.credit, f.inTurn = f.credit+int64(max(w.Weight, 1))*quantum, true
		}
		if charge {
			f.credit -= int64(w.Cost)
		}
		// Its turn is over when what is left does not cover its next waiter
		// (also one behind a waiter who left without a grant).
		if f.inTurn && int64(f.waiters.Front().Value.Cost) > f.credit {
			f.inTurn = false
			ring.Remove(&f.link)
			ring.PushBack(&f.link)
		}
	}
	if first { // after the charge: a turn's worth is the first waiters' as it starts
		q.x.counted(c, w.Cost, -1)
		if next := f.waiters.Front(); next != nil {
			q.x.counted(c, next.Value.Cost, 1)
		}
	}
	if q.n == 0 {
		q.mixed = false
		if q.x.peak > maxKeptFlows {
			q.x = nil // a burst of flows: its map is not kept by a quiet lane
		}
	}
	return true
}

// counted adds d to the count of class c's first waiters that cost cost.
func (x *sched) counted(c uint8, cost, d int32) {
	if cost <= 1 {
		return
	}
	b := bits.Len32(uint32(cost - 1)) // cost <= 1<<b
	if x.costs[c][b] += d; x.costs[c][b] == 0 {
		x.bits[c] &^= 1 << b
	} else {
		x.bits[c] |= 1 << b
	}
}

// Class yields the waiters of class c in the order they are to be served
// when any may be passed over (one that cannot be served yet does not hold
// back the ones after it): flows in turn order, each flow's waiters in
// arrival order. The queue must not change during the iteration.
func (q *Queue) Class(c uint8) iter.Seq[*ilist.Elem[*Waiter]] {
	return func(yield func(*ilist.Elem[*Waiter]) bool) {
		if !q.mixed {
			if c != ClassDefault {
				return
			}
			for el := q.def.waiters.Front(); el != nil; el = el.Next() {
				if !yield(el) {
					return
				}
			}
			return
		}
		for fe := q.x.rings[c].Front(); fe != nil; fe = fe.Next() {
			for el := fe.Value.waiters.Front(); el != nil; el = el.Next() {
				if !yield(el) {
					return
				}
			}
		}
	}
}

// FlowCount is one flow's number of waiters.
type FlowCount struct {
	Flow    string
	Waiting int
}

// Top returns, most waiters first, at most n flows (over all classes) and
// the number of waiters per class.
func (q *Queue) Top(n int) (byClass [NumClasses]int, top []FlowCount) {
	if !q.mixed {
		byClass[ClassDefault] = q.n
		if q.n > 0 && n > 0 {
			top = []FlowCount{{Flow: "", Waiting: q.n}}
		}
		return byClass, top
	}
	byClass = q.x.count
	per := map[string]int{}
	for c := range NumClasses {
		for fe := q.x.rings[c].Front(); fe != nil; fe = fe.Next() {
			per[fe.Value.key.id] += fe.Value.waiters.Len()
		}
	}
	for id, k := range per {
		top = append(top, FlowCount{Flow: id, Waiting: k})
	}
	slices.SortFunc(top, func(a, b FlowCount) int {
		return cmp.Or(cmp.Compare(b.Waiting, a.Waiting), cmp.Compare(a.Flow, b.Flow))
	})
	return byClass, top[:min(n, len(top))]
}

// QueueStats describes q as slots.QueueStats (S) does, its flows as
// slots.FlowStat (F): the one report of every owner's queue. The
// constraints are those types' fields, so a field added there must be
// added here too.
func QueueStats[S ~struct {
	Waiting                     int
	Interactive, Default, Batch int
	TopFlows                    []F
}, F ~struct {
	Flow    string
	Waiting int
}](q *Queue) S {
	by, top := q.Top(TopFlows)
	var flows []F
	for _, f := range top {
		flows = append(flows, F(f))
	}
	return S{Waiting: q.Len(), Interactive: by[ClassHigh], Default: by[ClassDefault], Batch: by[ClassLow], TopFlows: flows}
}
