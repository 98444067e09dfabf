package core

// HolderSet is the set of a lane's holders, each knowing its place through
// an index it owns (Hold.Idx, or an entry of a multi-lane record): removal
// moves the last holder into the freed place. The first holder is kept in
// the set itself, beside the count, so that a lane with one holder, the
// common case for a key, writes no other cache line. The zero value is
// empty.
type HolderSet struct {
	n    int
	one  holderRec             // place 0
	more []holderRec           // places 1..n-1
	by   [NumClasses - 1]int32 // holders per class other than the default
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

// startsScan bounds the holders Starts reads.
const startsScan = 64

// Starts appends the holders' starts (Hold.At) to buf, unless there are
// more than startsScan of them: then the order of their ends says little
// that a mean does not, and it returns buf as it is.
func (s *HolderSet) Starts(buf []int64) []int64 {
	if s.n == 0 || s.n > startsScan {
		return buf
	}
	buf = append(buf, s.one.h.At)
	for _, r := range s.more[:s.n-1] {
		buf = append(buf, r.h.At)
	}
	return buf
}

// ClassLen returns the number of holders of class c.
func (s *HolderSet) ClassLen(c uint8) int {
	if c == ClassDefault {
		return s.n - int(s.by[0]) - int(s.by[1])
	}
	return int(s.by[c-1])
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
	if h.Class != ClassDefault {
		s.by[h.Class-1]++
	}
}

// Remove removes h, whose place is kept in *idx, and reports whether it was
// there. A copy of a Slot (which go vet flags) is another Hold with a stale
// index: it is refused instead of removing someone else.
func (s *HolderSet) Remove(h *Hold, idx *int32) bool {
	i, last := int(*idx), s.n-1
	if i < 0 || i > last {
		return false
	}
	if r := s.rec(i); r.h != h || r.idx != idx {
		return false
	}
	if i != last {
		moved := *s.rec(last)
		*s.rec(i) = moved
		*moved.idx = int32(i)
	}
	if last == 0 {
		s.one = holderRec{}
	} else {
		s.more[last-1] = holderRec{}
		s.more = s.more[:last-1]
		if last == 1 && cap(s.more) > maxKeptMore {
			s.more = nil // a burst's capacity is not kept by a quiet lane
		}
	}
	s.n--
	if h.Class != ClassDefault {
		s.by[h.Class-1]--
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
	// Multi counts the waiters in Waiters that need other lanes too.
	Multi   int
	Waiters Queue
	// Shares, if not nil, guarantees parts of Limit to classes (CanTake).
	Shares *Shares
	// Told, if not nil, is the returns told to callers refused here
	// (RejectLane makes it).
	Told *Told
}

// HasRoom reports whether one more holder fits under the limit.
func (ln *Lane) HasRoom() bool { return ln.Holders.Len() < ln.Limit }

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

// Serve unlinks w, which is being granted, from the lane's queue.
func (ln *Lane) Serve(w *Waiter) { ln.Waiters.Served(&w.Elem) }

// Shares are the guaranteed parts of a lane's limit, per class (see
// Lane.CanTake). Set once, before use; shared read-only by an owner's lanes.
type Shares struct {
	Min      [NumClasses]int // kept from other classes while the class has waiters
	Reserved [NumClasses]int // kept from other classes even while it is idle
}

// CanTake reports whether a holder of class c may be admitted now.
//
// Without shares: whenever the lane has room. With shares, each class d is
// owed g(d): max(Min, Reserved) while it has waiters (c counts as waiting),
// its Reserved while it is idle, cut from the highest class down to what
// the limit leaves after the classes above it. c may take a slot only if
// that leaves free what the classes above it hold short of their g and,
// unless c itself holds less than its own g, what the classes below it hold
// short of theirs too. So a class short of its guarantee is served before
// higher classes, higher classes first among such; a reserve is lent to
// nobody but a higher class short of its own g; an idle class's Min neither
// keeps slots nor cuts the guarantees below it.
//
// A waiter counts as waiting on every lane it needs, also while another of
// its lanes is full, so its class keeps its Min on this lane meanwhile.
func (ln *Lane) CanTake(c uint8) bool {
	free := ln.Limit - ln.Holders.Len()
	if free <= 0 {
		return false
	}
	s := ln.Shares
	if s == nil {
		return true
	}
	g := ln.guarantees(c)
	short := ln.Holders.ClassLen(c) < g[c]
	need := 0
	for d := range NumClasses {
		if d == c {
			continue
		}
		if p := g[d] - ln.Holders.ClassLen(d); p > 0 && (rank[d] < rank[c] || !short) {
			need += p
		}
	}
	return free > need
}

// guarantees returns g(d) for every class d, with c counted as waiting:
// max(Min, Reserved) while d waits, Reserved while it is idle; cut from the
// highest class down to what the limit leaves. Only with shares.
func (ln *Lane) guarantees(c uint8) [NumClasses]int {
	var g [NumClasses]int
	left := ln.Limit
	for _, d := range Order {
		want := ln.Shares.Reserved[d]
		if d == c || ln.Waiters.ClassLen(d) > 0 {
			want = max(ln.Shares.Min[d], want)
		}
		g[d] = min(want, left)
		left -= g[d]
	}
	return g
}

// Short reports whether class c holds less than its guarantee (counting c
// as waiting): a slot it takes then is one it is owed. Always false without
// shares.
func (ln *Lane) Short(c uint8) bool {
	if ln.Shares == nil {
		return false
	}
	return ln.Holders.ClassLen(c) < ln.guarantees(c)[c]
}

// Candidate returns the waiter of ln to serve next among those for which
// ok holds (nil: every waiter), or nil: in the queue's order (the highest
// class that may take a slot of ln, then the flows' turns, then arrival),
// the first such waiter. This is the choice every grant loop of the module
// makes: a Limiter's with ok nil, a registry key's with ok checking the
// other keys a waiter needs, a pacing Gate's with ok checking the waiter's
// model and start time. A waiter for which ok fails does not hold back the
// ones after it.
func (ln *Lane) Candidate(ok func(*Waiter) bool) *Waiter {
	q := &ln.Waiters
	if !q.mixed && ok == nil {
		if q.n > 0 && ln.CanTake(ClassDefault) {
			return q.def.waiters.Front().Value
		}
		return nil
	}
	for _, c := range Order {
		if q.ClassLen(c) == 0 || !ln.CanTake(c) {
			continue
		}
		for el := range q.Class(c) {
			if ok == nil || ok(el.Value) {
				return el.Value
			}
		}
	}
	return nil
}

// Admits reports whether a newcomer of class c, needing this lane alone, is
// admitted at once. Waiters that need other lanes too may be passed (they
// are blocked elsewhere; their owner bounds how often); waiters for this
// lane alone are not. With shares
// that rests on the owner serving every waiter that can be served whenever
// anything changes (a release, a limit change, a withdrawal): then a waiter
// of this lane alone is one that cannot take a slot, and neither can a
// newcomer of its class.
func (ln *Lane) Admits(c uint8) bool {
	if ln.Shares != nil {
		return ln.CanTake(c)
	}
	return ln.Holders.n < ln.Limit && ln.Waiters.n == ln.Multi
}
