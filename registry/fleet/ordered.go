package fleet

import "slices"

// The ordering of waiters' calls (see calls): which keys have ordered
// calls on their way, and which queued calls must wait for them.

// tell calls each of placed (see scriptCall.placed), without calls.mu.
func tell(placed []func()) {
	for _, f := range placed {
		f()
	}
}

// cappedKeys are c's capped keys.
func (c *scriptCall) cappedKeys() []string { return c.call.Keys }

// followsLocked reports whether an ordered call on capped must wait for
// the next pipeline: an ordered call on one of those keys is on its way,
// or queued.
func (q *calls) followsLocked(capped []string) bool {
	for _, k := range capped {
		if q.ordered[k] > 0 {
			return true
		}
	}
	for _, c := range q.pending {
		if c.ordered && slices.ContainsFunc(c.cappedKeys(), func(k string) bool { return slices.Contains(capped, k) }) {
			return true
		}
	}
	return false
}

// sendingLocked counts d ordered calls on capped more (or fewer) on their
// way.
func (q *calls) sendingLocked(capped []string, d int) {
	if q.ordered == nil {
		q.ordered = map[string]int{}
	}
	for _, k := range capped {
		if q.ordered[k] += d; q.ordered[k] <= 0 {
			delete(q.ordered, k)
		}
	}
	if len(q.ordered) == 0 {
		q.ordered = nil // let a burst's map go
	}
}

// holdsLocked reports whether ordered call c must stay queued: an ordered
// call on one of its keys is on its way, or was left queued before it
// (held).
func (q *calls) holdsLocked(c *scriptCall, held map[string]bool) bool {
	for _, k := range c.cappedKeys() {
		if q.ordered[k] > 0 || held[k] {
			return true
		}
	}
	return false
}
