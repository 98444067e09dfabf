package fleet

import (
	"slices"

	"github.com/inflight-go/inflight/slots"
)

// A learned cap as admissions and limits read it: the lookups of the
// learned caps (see learnedCaps for their lock), the ceiling each takes
// from its key's limit, and the limit each puts on the local registry and
// on an admission.

// forget drops key's learning; it reports whether key was learned.
func (c *learnedCaps[K]) forget(key K) bool {
	c.mu.Lock()
	defer c.mu.Unlock() // a key that cannot be hashed panics
	lk := c.learning[key]
	if lk != nil {
		delete(c.learning, key)
		delete(c.learnedBy, lk.name)
	}
	return lk != nil
}

// of returns key's learning; nil if it is not learned. Under the
// Registry's mu, a key it finds not learned stays so until the mu is
// unlocked (Learn holds it).
func (c *learnedCaps[K]) of(key K) *learning {
	if !c.ever.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.learning[key]
}

// anyOf reports whether any of keys is learned.
func (c *learnedCaps[K]) anyOf(keys []K) bool {
	if !c.ever.Load() {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.ContainsFunc(keys, func(k K) bool { return c.learning[k] != nil })
}

// close marks the learned caps closed: Report and a flush do nothing
// from then on.
func (c *learnedCaps[K]) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// reconfigureLocked applies key's limit without learning (its ceiling) to
// its learned cap, under r.mu; it reports whether key is learned.
func (r *Registry[K]) reconfigureLocked(key K) bool {
	return r.learnedLocked(key, func(lk *learning, static int) { lk.configureLocked(ceiling(static)) })
}

// learnedLocked calls fn, under the learned caps' mu, with key's learning
// and its limit without learning, and reports whether key is learned;
// call it under r.mu. The LimitFunc is asked only for a learned key: one
// not learned under r.mu stays so (Learn holds it), and one forgotten
// meanwhile is looked up again.
func (r *Registry[K]) learnedLocked(key K, fn func(lk *learning, static int)) bool {
	if r.learned.of(key) == nil {
		return false
	}
	static := r.staticLimitLocked(key)
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	lk := c.learning[key]
	if lk == nil { // forgotten meanwhile
		return false
	}
	fn(lk, static)
	return true
}

// configureLocked applies lk's settings and the ceiling configured to its
// cap and its base.
func (lk *learning) configureLocked(configured int) {
	lk.settings.Configure(&lk.cap, configured)
	lk.settings.Configure(&lk.base, configured)
	lk.gen++
}

// configuredLocked returns key's limit without learning, as a learned
// cap's ceiling takes it (0: none).
func (r *Registry[K]) configuredLocked(key K) int {
	return ceiling(r.staticLimitLocked(key))
}

// ceiling is a limit without learning as a learned cap's ceiling takes it
// (0: none).
func ceiling(static int) int {
	if static == slots.Unlimited {
		return 0
	}
	return static
}

// learnedLimit returns the limit of key if it is learned.
func (r *Registry[K]) learnedLimit(key K) (int, bool) {
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	lk := c.learning[key]
	if lk == nil {
		return 0, false
	}
	return lk.cap.Limit(r.clock.nanos()), true
}

// overLearned returns the first learned key of l, just admitted as st
// tells, whose cap is now below its count with that start (the limit l's
// call sent was higher: a cut came meanwhile), and that cap; -1 if none.
func (r *Registry[K]) overLearned(l *lease[K], st start) (int, int) {
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	now := r.clock.nanos()
	for i, k := range l.keys {
		if lk := c.learning[k]; lk != nil {
			if limit := lk.cap.Limit(now); int(st.counts[i]) > limit {
				return i, limit
			}
		}
	}
	return -1, 0
}

// cutLimits lowers l's limits to its learned keys' caps now, so that the
// removal of l, given back over a cut, serves the queues under them.
func (r *Registry[K]) cutLimits(l *lease[K]) {
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	now := r.clock.nanos()
	for i, k := range l.keys {
		if lk := c.learning[k]; lk != nil {
			l.limits[i] = min(l.limits[i], lk.cap.Limit(now))
		}
	}
}

// withLearned calls fn with key's learning and its limit now, under the
// learned caps' mu; it reports whether key is learned.
func (r *Registry[K]) withLearned(key K, fn func(lk *learning, limit int)) bool {
	r.mu.Lock()
	defer r.mu.Unlock() // the LimitFunc may panic
	return r.learnedLocked(key, func(lk *learning, static int) {
		fn(lk, min(static, lk.cap.Limit(r.clock.nanos())))
	})
}

// applyLearned sets key's limit in the local registry to its learned one,
// wakes the waiters if it rose, and logs the changes made.
func (r *Registry[K]) applyLearned(key K) {
	defer r.logLearned()
	r.learned.learnMu.Lock()
	defer r.learned.learnMu.Unlock()
	n, old, ok := r.learnedFor(key)
	if !ok || n == old {
		return
	}
	r.local.SetLimit(key, n)
	if n > old {
		r.wakeAll()
	}
}

// learnedFor returns key's limit now and the one last applied, and records
// that it is applied; false if key is not learned.
func (r *Registry[K]) learnedFor(key K) (n, old int, ok bool) {
	ok = r.withLearned(key, func(lk *learning, limit int) {
		n, old, lk.applied = limit, lk.applied, limit
	})
	return n, old, ok
}
