package core

import "github.com/inflight-go/inflight/internal/ilist"

// Len and Cap report the returns told and the room their list takes.
func (t *Told) Len() int { return len(t.dues) }
func (t *Told) Cap() int { return cap(t.dues) }

// CheckFirsts reports whether the counts of the flows' first waiters by
// cost (what a turn's worth reads, Served) are those of the flows queued now.
func (q *Queue) CheckFirsts() bool {
	if q.x == nil {
		return true
	}
	var x sched
	if q.mixed {
		for c := range NumClasses {
			for fe := q.x.rings[c].Front(); fe != nil; fe = fe.Next() {
				x.counted(c, fe.Value.waiters.Front().Value.Cost, 1)
			}
		}
	}
	return x.costs == q.x.costs && x.bits == q.x.bits
}

// Head returns the waiter of class c to serve next, or nil: the first that
// Class yields.
func (q *Queue) Head(c uint8) *ilist.Elem[*Waiter] {
	if !q.mixed {
		if c != ClassDefault {
			return nil
		}
		return q.def.waiters.Front()
	}
	fe := q.x.rings[c].Front()
	if fe == nil {
		return nil
	}
	return fe.Value.waiters.Front()
}
