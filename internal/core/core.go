// Package core holds what the slots and registry packages share: the record
// of one admission (Hold), a waiter, a lane of capacity, and the wait loop.
//
// Locking: a Lane and the Waiters queued on it belong to their owner's lock
// (the Limiter's mutex, a registry shard's mutex). Nothing here locks.
package core

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/ilist"
)

// An Owner frees the capacity a Hold took. Methods may be called from any
// goroutine, without the owner's lock held.
type Owner interface {
	// Release frees h's capacity and reports whether it did. It is called
	// at most once per Hold; it reports false (and reports the misuse to
	// Misuse) for a copy of a Slot, which is another Hold that holds nothing.
	Release(h *Hold) bool
	// Misuse counts a Release call on a Hold that was already released.
	Misuse(h *Hold)
	// Time converts an acquire time (owner clock nanoseconds) to a time.Time.
	Time(at int64) time.Time
}

// Hold is the record of one admission: the holder that a lane counts.
// It is the whole of the user's *slots.Slot, so admission allocates once;
// it is kept small and nearly pointer-free (48 bytes, one interface) because
// its allocation and the GC work after it are most of an admission's cost.
type Hold struct {
	released atomic.Bool
	// Idx is the hold's place in its lane's HolderSet; a multi-lane hold
	// keeps its places in its owner's record instead. Guarded by the owner's
	// lock.
	Idx int32

	// Owner frees the capacity: the lane the hold was admitted in, or a
	// record of its lanes.
	Owner    Owner
	ID       uint64
	At       int64 // acquire (grant) time, owner clock nanoseconds
	Bypassed bool  // admitted by fail-open; holds no capacity
	Degraded bool  // admitted without its fleet-wide cap (its store was unreachable)
	Class    uint8 // priority class: ClassDefault for a fast admission without shares
	// GivenBack marks a grant returned because its caller's context ended
	// as it came: the owner frees it like any other but reports no release.
	GivenBack bool
}

// Release frees the hold's capacity once and reports whether this call did.
func (h *Hold) Release() bool {
	if !h.released.CompareAndSwap(false, true) {
		h.Owner.Misuse(h)
		return false
	}
	return h.Owner.Release(h)
}

// Released reports whether Release has been called.
func (h *Hold) Released() bool { return h.released.Load() }

// ReleaseQuietly is Release for the seams that may see several ends of one
// use (a body's EOF, then its Close, then its context's end): a call after
// the first is expected there, not misuse, and is not counted.
func (h *Hold) ReleaseQuietly() bool {
	if !h.released.CompareAndSwap(false, true) {
		return false
	}
	return h.Owner.Release(h)
}

// Bypass marks h as admitted by fail-open: it holds no capacity, so its
// release frees nothing, but a copy of its Slot must still be told from it.
// Its owner from then on is a small record of h (fail-open is the rare
// path, so the allocation is paid only there).
func Bypass(h *Hold) {
	h.Bypassed = true
	h.Owner = &bypassed{owner: h.Owner, hold: h}
}

// bypassed is the Owner of a fail-open hold.
type bypassed struct {
	owner Owner // counts misuse and converts times
	hold  *Hold
}

func (b *bypassed) Release(h *Hold) bool {
	if h != b.hold {
		b.owner.Misuse(h)
		return false
	}
	return true
}

func (b *bypassed) Misuse(h *Hold)          { b.owner.Misuse(h) }
func (b *bypassed) Time(at int64) time.Time { return b.owner.Time(at) }

// Handle is the record behind a user's *slots.Slot, which package slots
// declares as a Handle (type Slot core.Handle): every package of the module
// can make a Slot with new(core.Handle) and a conversion, and reach its hold
// through Hold, while users can reach neither.
type Handle struct{ h Hold }

// Hold returns the hold inside x.
func (x *Handle) Hold() *Hold { return &x.h }

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

// Waiter states; guarded by the owner's lock.
const (
	Waiting uint8 = iota
	Granted
	Gone // cancelled or timed out before a grant
)

// Waiter is one caller blocked in Acquire.
type Waiter struct {
	// ready (buffered 1) carries the grant. A channel, not a WaitGroup or a
	// Cond: a grant may come from a goroutine inside a testing/synctest
	// bubble for a waiter outside it, which a channel allows and a
	// WaitGroup turns into a fatal error.
	ready chan struct{}

	State uint8
	Class uint8 // the hold's class, copied here for the queue
	Hold  *Hold // the caller's hold; counted by its lane(s) once granted
	Seq   uint64
	// Flow and Weight place the waiter among the flows of its class.
	Flow   string
	Weight int32

	// Elem links the waiter into its lane's Waiters.
	Elem ilist.Elem[*Waiter]
}

// NewWaiter returns a waiter for h in state Waiting. Waiters are not
// pooled: a channel belongs to the testing/synctest bubble that made it, and
// a pooled one would cross from one test's bubble into another.
func NewWaiter(h *Hold) *Waiter {
	w := &Waiter{ready: make(chan struct{}, 1), Hold: h, Class: h.Class}
	w.Elem.Value = w
	return w
}

func (w *Waiter) wake() { w.ready <- struct{}{} }

// Wakes collects the waiters granted under an owner's lock, to be woken once
// the lock is released: a goroutine woken under the lock would first contend
// for it. The zero value is empty; keep it on the stack.
type Wakes struct {
	n    int
	ws   [4]*Waiter
	more []*Waiter
}

// Grant marks w granted; call under the owner's lock, after w's hold has
// been counted. w is woken by Wake.
func (k *Wakes) Grant(w *Waiter) {
	w.State = Granted
	if k.n < len(k.ws) {
		k.ws[k.n] = w
		k.n++
		return
	}
	k.more = append(k.more, w)
}

// Wake wakes the granted waiters; call after releasing the owner's lock.
// A waiter whose context ended meanwhile finds State == Granted and waits for
// this signal before giving the grant back.
func (k *Wakes) Wake() {
	if k.n == 0 {
		return
	}
	for _, w := range k.ws[:k.n] {
		w.wake()
	}
	for _, w := range k.more {
		w.wake()
	}
}

// Outcome is how a wait ended.
type Outcome uint8

const (
	OutGranted  Outcome = iota // the caller holds capacity
	OutCanceled                // ctx ended first; the caller holds nothing
	OutExpired                 // the max wait passed first; the caller holds nothing
)

// Await blocks until w is granted, ctx ends or expire fires (nil: never).
// withdraw must, under the owner's lock, unlink w if it is still Waiting, mark
// it Gone and report true; it reports false when w was granted already.
//
// A caller whose context has ended never leaves with capacity: a grant that
// races ctx's end is given back (released, so the capacity passes to the next
// waiter) and the outcome is OutCanceled, whichever case select saw first. A
// grant that races expiry alone is kept: the caller asked to wait that long
// and got in.
func Await(ctx context.Context, w *Waiter, expire <-chan time.Time, withdraw func(*Waiter) bool) Outcome {
	done := ctx.Done()
	if done == nil && expire == nil {
		<-w.ready // nothing else can end this wait; a plain receive is cheaper
		return OutGranted
	}
	select {
	case <-w.ready:
	case <-done:
		if withdraw(w) {
			return OutCanceled
		}
		<-w.ready
	case <-expire:
		if withdraw(w) {
			if isDone(done) {
				return OutCanceled
			}
			return OutExpired
		}
		<-w.ready
	}
	if isDone(done) {
		w.Hold.GivenBack = true
		w.Hold.Release()
		return OutCanceled
	}
	return OutGranted
}

// Ended reports whether ctx has ended. Admissions call it under their
// owner's lock, as the last check before they decide.
func Ended(ctx context.Context) bool { return isDone(ctx.Done()) }

func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}
