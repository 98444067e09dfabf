package core

// Len and Cap report the returns told and the room their list takes.
func (t *Told) Len() int { return len(t.dues) }
func (t *Told) Cap() int { return cap(t.dues) }

// CheckFirsts reports whether the counts of the flows' first waiters by
// cost (what quantum reads) are those of the flows queued now.
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
