package core

import "slices"

// HolderSet is the set of a lane's holders, each knowing its place through
// an index it owns (Hold.Idx, or an entry of a multi-lane record): removal
// moves the last holder into the freed place. It counts the holders and
// the units they weigh (Hold.Units), in all and per class. The first holder
// is kept in the set itself, beside the count, so that a lane with one
// holder, the common case for a key, writes no other cache line. The zero
// value is empty.
type HolderSet struct {
	n   int
	one holderRec // place 0
	// x is the units held beyond one per holder: 0, and never written,
	// while every holder weighs one, so such a lane's admissions touch no
	// field after one.
	x    int
	by   [NumClasses - 1]int // units held per class other than the default
	more []holderRec         // places 1..n-1
}

type holderRec struct {
	h   *Hold
	idx *int32 // where h's place in this set is kept
}

// minMore is the first capacity of the overflow: four records fill one cache
// line, so sets of different lanes, written from different cores, never
// share one. maxKeptMore bounds what a drained set keeps.
const (
	minMore     = 4
	maxKeptMore = 64
)

// Len returns the number of holders.
func (s *HolderSet) Len() int { return s.n }

// Units returns the units the holders weigh together.
func (s *HolderSet) Units() int { return s.n + s.x }

// EndsScan bounds the holders Ends reads.
const EndsScan = 64

// Ends appends the holders' starts (Hold.At) and units (as units counts
// them, total in all: Hold.Units and Units for a lane's own) to buf; of more
// than EndsScan holders, a sample of EndsScan spread over the set (which is
// in no order), their units scaled to stand for all those held (a heavy
// holder left out of the sample is missed).
func (s *HolderSet) Ends(buf []End, units func(*Hold) int, total int) []End {
	k, sum, start := min(s.n, EndsScan), 0, len(buf)
	for i := range k {
		h := s.rec(i * s.n / k).h
		buf = append(buf, End{h.At, units(h)})
		sum += buf[len(buf)-1].Units
	}
	// Scaled (by 1 when all are read), rounded so that they add up.
	f, acc := float64(total)/float64(sum), 0.0
	for i := range buf[start:] {
		prev := int(acc)
		acc += float64(buf[start+i].Units) * f
		buf[start+i].Units = max(int(acc)-prev, 1)
	}
	return buf
}

// classUnits returns the units the holders of class c weigh.
func (s *HolderSet) classUnits(c uint8) int {
	if c == ClassDefault {
		return s.n + s.x - s.by[0] - s.by[1]
	}
	return s.by[c-1]
}

func (s *HolderSet) rec(i int) *holderRec {
	if i == 0 {
		return &s.one
	}
	return &s.more[i-1]
}

// Add adds h, recording its place in *idx.
func (s *HolderSet) Add(h *Hold, idx *int32) {
	*idx = int32(s.n)
	if s.n == 0 {
		s.one = holderRec{h, idx}
	} else {
		if s.more == nil {
			s.more = make([]holderRec, 0, minMore)
		}
		s.more = append(s.more, holderRec{h, idx})
	}
	s.n++
	s.x += int(h.Extra)
	if h.Class != ClassDefault {
		s.by[h.Class-1] += int(h.Extra) + 1
	}
}

// Remove removes h, whose place is kept in *idx, and reports whether it was
// there. A copy of a Slot (which go vet flags) is another Hold with a stale
// index: it is refused instead of removing someone else.
func (s *HolderSet) Remove(h *Hold, idx *int32) bool {
	i, last := int(*idx), s.n-1
	if i < 0 || i > last || *s.rec(i) != (holderRec{h, idx}) {
		return false
	}
	if i != last {
		moved := *s.rec(last)
		*s.rec(i) = moved
		*moved.idx = int32(i)
	}
	*s.rec(last) = holderRec{}
	if last > 0 {
		s.more = s.more[:last-1]
		if last == 1 && cap(s.more) > maxKeptMore {
			s.more = nil // a burst's capacity is not kept by a quiet lane
		}
	}
	s.n--
	s.x -= int(h.Extra)
	if h.Class != ClassDefault {
		s.by[h.Class-1] -= int(h.Extra) + 1
	}
	return true
}

// At returns the i-th holder, 0 <= i < Len(), in no particular order.
func (s *HolderSet) At(i int) *Hold { return s.rec(i).h }

// Lane is one pool of capacity: its holders and its waiters, in order.
type Lane struct {
	// Admissions read Limit and write Holders; the waiter fields after them
	// change only when someone waits.
	Limit   int
	Holders HolderSet
	// Told, if not nil, is the returns told to callers refused here
	// (RejectLaneTurns makes it); a release reads it beside Multi.
	Told *Told
	// Multi counts the waiters in Waiters that need other lanes too.
	Multi   int
	Waiters Queue
	// Shares, if not nil, guarantees parts of Limit to classes (CanTake).
	Shares *Shares
}

// Remove removes h from the holders (HolderSet.Remove, which see), and
// counts the units it frees for the returns told on ln.
func (ln *Lane) Remove(h *Hold, idx *int32) bool {
	removed := ln.Holders.Remove(h, idx)
	if removed && ln.Told != nil {
		ln.Told.freed += uint64(h.Units())
	}
	return removed
}

// HasRoom reports whether one more unit fits under the limit.
func (ln *Lane) HasRoom() bool { return ln.Holders.Units() < ln.Limit }

// Free returns the units left under the limit (negative while a lowered
// limit is still exceeded).
func (ln *Lane) Free() int { return ln.Limit - ln.Holders.Units() }

// Withdraw unlinks w from the lane's queue if it is still waiting, marks it
// Gone and reports true; it reports false when w was granted already. Only
// for a waiter of this lane alone; call under the owner's lock.
func (ln *Lane) Withdraw(w *Waiter) bool {
	if w.State != Waiting {
		return false
	}
	ln.Waiters.Remove(&w.Elem)
	w.State = Gone
	return true
}

// Serve unlinks w, which is being granted, from the lane's queue; its
// owner counts its units against the blocker it passed (Waiter.Pass).
func (ln *Lane) Serve(w *Waiter) { ln.Waiters.Served(&w.Elem) }

// PassFactor and PassScan bound how far waiters pass a blocker, on every
// owner and store (Lane.Candidate).
const (
	PassFactor = 4
	PassScan   = 64
)

// Shares are the guaranteed parts of a lane's limit, per class (see
// Lane.CanTake). Set once, before use; shared read-only by an owner's lanes.
type Shares struct {
	Min      [NumClasses]int // kept from other classes while the class has waiters
	Reserved [NumClasses]int // kept from other classes even while it is idle
}

// CanTake reports whether a holder of class c weighing n units may be
// admitted now.
//
// Without shares: whenever n units are free. With shares, each class d is
// owed g(d) units: max(Min, Reserved) while it has waiters (c counts as
// waiting), its Reserved while it is idle, cut from the highest class down
// to what the limit leaves after the classes above it. c may take n units
// only if that leaves free what the classes above it hold short of their
// g and, unless the n units are no more than what c itself holds short of
// its g, what the classes below it hold short of theirs too: n units are
// admitted exactly when n admissions of one unit would be. So a class short
// of its guarantee is served before higher classes, higher classes first
// among such, up to its guarantee; a reserve
// is lent to nobody but a higher class short of its own g, and only for
// that shortfall; an idle class's Min neither keeps units nor cuts the
// guarantees below it.
//
// A waiter counts as waiting on every lane it needs, also while another of
// its lanes is full, so its class keeps its Min on this lane meanwhile.
func (ln *Lane) CanTake(c uint8, n int) bool {
	free := ln.Limit - ln.Holders.Units()
	if free < n {
		return false
	}
	if ln.Shares == nil {
		return true
	}
	g := ln.guarantees(c, ln.waits)
	above, below, own := ln.owed(c, &g, ln.Holders.classUnits)
	// What is left free once it took n: as if it took them one at a time.
	return free-n >= above && (n <= own || free-n >= above+below)
}

// owed returns, by the guarantees g with held giving what each class
// holds, what the classes above c and those below it hold short of their
// g, and c's own shortfall.
func (ln *Lane) owed(c uint8, g *[NumClasses]int, held func(uint8) int) (above, below, own int) {
	for d := range NumClasses {
		p := max(g[d]-held(d), 0)
		switch {
		case d == c:
			own = p
		case rank[d] < rank[c]:
			above += p
		default:
			below += p
		}
	}
	return above, below, own
}

// guarantees returns g(d) for every class d, with c counted as waiting
// and the others as waits says: max(Min, Reserved) while d waits, Reserved
// while it is idle; cut from the highest class down to what the limit
// leaves. Only with shares.
func (ln *Lane) guarantees(c uint8, waits func(d uint8) bool) [NumClasses]int {
	var g [NumClasses]int
	left := ln.Limit
	for _, d := range Order {
		want := ln.Shares.Reserved[d]
		if d == c || waits(d) {
			want = max(ln.Shares.Min[d], want)
		}
		g[d] = min(want, left)
		left -= g[d]
	}
	return g
}

// Capacity returns the most units a holder of class c is sure to be
// admitted with under the current limit: the limit, less with shares what
// the other classes are guaranteed while they wait (max(Min, Reserved)). A
// caller asking for more could wait forever (as long as the classes owed
// their shares keep them busy), so owners refuse it at once, and refuse a
// waiter whose lane's Capacity drops below its weight.
func (ln *Lane) Capacity(c uint8) int {
	if ln.Shares == nil {
		return ln.Limit
	}
	return ln.room(c, func(uint8) bool { return true })
}

// Closed reports whether class c can take no unit of the lane until its
// limit is raised, however idle the others are: the limit is 0, or the
// other classes' Reserved leave c none. For c it is a pause: a waiter of
// one unit waits (Capacity, counting their Min too, refuses heavier ones).
func (ln *Lane) Closed(c uint8) bool {
	return ln.Limit == 0 || ln.Shares != nil && ln.room(c, func(uint8) bool { return false }) < 1
}

// room is what CanTake lets class c take of an empty lane whose other
// classes wait as waits says, solved for n. Only with shares.
func (ln *Lane) room(c uint8, waits func(d uint8) bool) int {
	g := ln.guarantees(c, waits)
	above, below, own := ln.owed(c, &g, func(uint8) int { return 0 })
	return min(ln.Limit-above, max(own, ln.Limit-above-below))
}

func (ln *Lane) waits(d uint8) bool { return ln.Waiters.ClassLen(d) > 0 }

// Short reports whether class c holds less than its guarantee (counting c
// as waiting): a unit it takes then is one it is owed. Always false
// without shares.
func (ln *Lane) Short(c uint8) bool {
	return ln.Shares != nil && ln.Holders.classUnits(c) < ln.guarantees(c, ln.waits)[c]
}

// Candidate returns the waiter of ln to serve next among those for which
// ok holds (nil: every waiter), or nil: in the queue's order (the highest
// class that may take a unit of ln, then the flows' turns, then arrival),
// the first such waiter, if its units fit. This is the choice every grant
// loop of the module makes: a Limiter's with ok nil, a registry key's with
// ok checking the other keys a waiter needs, a pacing Gate's with ok
// checking the waiter's model and start time. A waiter for which ok fails
// does not hold back the ones after it; ok is told whether w would pass
// a blocker (below).
//
// A waiter whose units do not fit yet (a blocker) lets those after it
// take free units until Waiter.Passed reaches PassFactor times its units,
// looking at most PassScan waiters past it; passed is the first blocker w
// passes (Waiter.Pass). Then order is strict: nobody after it takes the
// units it waits for (only classes owed their share, Short, go on, as
// they do past the scan's bound), so it waits at most for the units that
// passed it, beside those held before (a blocker behind another is passed
// uncounted meanwhile: the k-th waits for about k bounds).
// Strict order alone (x/sync's) idles up to its units less one meanwhile;
// passing without a bound starves it.
func (ln *Lane) Candidate(ok func(w *Waiter, passing bool) bool) (w, passed *Waiter) {
	q := &ln.Waiters
	if !q.mixed && ok == nil {
		if q.n == 0 {
			return nil, nil
		}
		if w := q.def.waiters.Front().Value; ln.CanTake(ClassDefault, int(w.Hold.Extra)+1) {
			return w, nil
		} else if w.Hold.Extra == 0 {
			return nil, nil // no unit is free
		}
	}
	looked := 0     // waiters looked at past the first blocker
	strict := false // a blocker keeps its place: only owed classes may pass
	for _, c := range Order {
		if q.ClassLen(c) == 0 || !ln.CanTake(c, 1) || strict && !ln.Short(c) {
			continue
		}
		for el := range q.Class(c) {
			w := el.Value
			if passed != nil && !strict {
				if looked++; looked > PassScan {
					strict = true // past the scan only owed classes go on
					if !ln.Short(c) {
						break
					}
				}
			}
			if ok != nil && !ok(w, passed != nil) {
				continue
			}
			if w.Hold.Extra == 0 || ln.CanTake(c, int(w.Hold.Extra)+1) {
				return w, passed
			}
			if strict || w.Passed >= PassFactor*(int64(w.Hold.Extra)+1) {
				strict = true
				break
			}
			if passed == nil {
				passed = w
			}
		}
	}
	return nil, nil
}

// Admits reports whether a newcomer of class c weighing n units, needing
// this lane alone, is admitted at once. Waiters that need other lanes too
// may be passed (they are blocked elsewhere; their owner bounds how often);
// waiters for this lane alone are not. With shares that rests on the owner
// serving every waiter that can be served whenever anything changes (a
// release, a limit change, a withdrawal): then a waiter of this lane alone
// is one that cannot take a unit, and neither can a newcomer of its class.
// A waiter weighing more than one unit may be unable to take its units
// while a newcomer could take fewer: while one of the newcomer's class or a
// higher one waits (HeavyAhead), a newcomer with shares queues too, and its
// owner serves the queue at once.
func (ln *Lane) Admits(c uint8, n int) bool {
	if ln.Shares == nil {
		// The sum cannot overflow: units held near MaxInt would take more
		// than 2^32 holders.
		return ln.Holders.n+ln.Holders.x+n <= ln.Limit && ln.Waiters.n == ln.Multi
	}
	return ln.CanTake(c, n) && !ln.HeavyAhead(c)
}

// HeavyAhead reports whether a waiter weighing more than one unit, of
// class c or a higher one, queues on ln: it may be unable to take the units
// a newcomer of class c would, and keeps its place (Candidate), so the
// newcomer must queue behind it. Waiters that need other lanes count too,
// although they may be passed: the newcomer queues, and its owner serves
// the queue at once if it can.
func (ln *Lane) HeavyAhead(c uint8) bool {
	return slices.ContainsFunc(Order[:rank[c]+1], func(d uint8) bool { return ln.Waiters.heavy[d] > 0 })
}

// Overweight appends to dst the waiters of ln that weigh more than it can
// ever admit under its limit now (Capacity), and returns it: call under the
// owner's lock after the limit changed, and refuse them (Wakes.Refuse). A
// limit of 0 pauses the lane rather than shrinking it: nobody is refused
// then (nor a waiter of one unit whose class is Closed).
func (ln *Lane) Overweight(dst []*Waiter) []*Waiter {
	if ln.Waiters.Heavy() == 0 || ln.Limit <= 0 {
		return dst
	}
	for _, c := range Order {
		limit := ln.Capacity(c)
		for el := range ln.Waiters.Class(c) {
			if el.Value.Hold.Extra > 0 && int(el.Value.Hold.Extra) >= limit {
				dst = append(dst, el.Value)
			}
		}
	}
	return dst
}

// TooHeavy reports whether a caller of class c weighing n units must be
// refused at once: it weighs more than one unit and more than the lane can
// ever admit under its limit (Capacity), which is not 0 (a pause).
func (ln *Lane) TooHeavy(c uint8, n int) bool {
	return n > 1 && ln.Limit > 0 && n > ln.Capacity(c)
}
