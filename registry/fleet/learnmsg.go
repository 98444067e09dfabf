package fleet

import (
	"encoding/json"
	"strings"
)

// The learned states other processes publish (see learnsync.go): a
// message takes a later state at once; one that cannot be read, or is of
// another epoch, makes the process read the states.

// learnedMessage takes a message on the learned channel: a state written,
// which this process takes if it is later than the one it has (one that
// cannot be read makes it read every state).
func (r *Registry[K]) learnedMessage(payload string) {
	key, format, ok := learnedFormatOf(payload)
	if ok && (strings.HasPrefix(key, overridesPrefix) || format > learnedFormat) {
		// An Overrides' record, which its own listener takes; or a state
		// in a later format, which this process's reads leave alone.
		return
	}
	var st storedCap
	bad := json.Unmarshal([]byte(payload), &st) != nil || !st.Cap.Valid()
	k, taken, read := r.takeMessage(st, bad)
	if read {
		r.kickLearner()
	}
	if taken {
		r.applyLearned(k)
	}
}

// takeMessage takes st as the state of its key if it is later than the one
// known (taken), or marks states to be read (read).
func (r *Registry[K]) takeMessage(st storedCap, bad bool) (k K, taken, read bool) {
	k, lk, later, read := r.learned.message(st, bad, r.epoch.Load())
	if lk == nil || !later {
		return k, lk != nil, read
	}
	r.mu.Lock()
	defer r.mu.Unlock() // the LimitFunc may panic
	if r.learned.of(k) != lk {
		return k, true, false // forgotten meanwhile
	}
	configured := r.configuredLocked(k)
	c := &r.learned
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.learning[k] != lk || st.V <= lk.stored.V { // forgotten, or overtaken
		return k, true, false
	}
	lk.stored = st
	lk.settings.Configure(&st.Cap, configured)
	lk.base, lk.known = st.Cap, true
	lk.rebaseLocked()
	c.toldLocked(lk, "another process")
	return k, true, false
}

// message finds the learning st is a state of (nil: none, or bad), and
// whether st is later than the state it knows; a message that cannot be
// read or is of another epoch than epoch marks states to be read (read).
func (c *learnedCaps[K]) message(st storedCap, bad bool, epoch int64) (k K, lk *learning, later, read bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if bad {
		for _, lk := range c.learning {
			lk.staleLocked()
		}
		return k, nil, false, true
	}
	k, ok := c.learnedBy[st.Key]
	if !ok {
		return k, nil, false, false
	}
	lk = c.learning[k]
	if st.E == 0 || st.E != epoch { // another database's, or data's
		lk.staleLocked()
		return k, nil, false, true
	}
	return k, lk, st.V > lk.stored.V, false
}

// learnedStale marks every learned state to be read again (a subscription
// made again may have missed messages).
func (r *Registry[K]) learnedStale() {
	c := &r.learned
	c.mu.Lock()
	for _, lk := range c.learning {
		lk.staleLocked()
	}
	n := len(c.learning)
	c.mu.Unlock()
	if n > 0 {
		r.kickLearner()
	}
}
