package fleet

import (
	"math/rand/v2"
	"slices"
	"time"
)

// waiter is one caller of this process waiting in Acquire.
type waiter struct {
	rank uint8    // its priority class's rank (core.Rank): lower goes first
	keys []string // its Redis keys
	// blocked are the keys on which it holds back later waiters: all of its
	// keys until it has been told one is full, then that key alone.
	blocked []string
	wake    chan struct{} // buffered 1
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (r *Registry[K]) enqueue(w *waiter) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	w.blocked = w.keys
	// After every waiter of its class or a higher one: by class, then in
	// arrival order.
	i := len(r.waiters)
	for i > 0 && r.waiters[i-1].rank > w.rank {
		i--
	}
	r.waiters = slices.Insert(r.waiters, i, w)
	return nil
}

// dequeue removes w and lets the waiters after it look again.
func (r *Registry[K]) dequeue(w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.Index(r.waiters, w)
	if i < 0 {
		return
	}
	r.waiters = slices.Delete(r.waiters, i, i+1)
	for _, v := range r.waiters[i:] {
		v.signal()
	}
}

// mayTry reports whether w may ask Redis now: no earlier waiter of this
// process holds back any of its keys. If some do, w from then on holds back
// later waiters on those keys alone, not on its others.
func (r *Registry[K]) mayTry(w *waiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ahead []string // w's keys held back by earlier waiters
	i := 0
	for ; i < len(r.waiters) && r.waiters[i] != w; i++ {
		for _, k := range r.waiters[i].blocked {
			if slices.Contains(w.keys, k) && !slices.Contains(ahead, k) {
				ahead = append(ahead, k)
			}
		}
		if len(ahead) == len(w.keys) { // all held back: no need to look further
			i = slices.Index(r.waiters, w)
			break
		}
	}
	if len(ahead) == 0 {
		return true
	}
	if !slices.Equal(ahead, w.blocked) {
		w.blocked = ahead
		for _, v := range r.waiters[min(i+1, len(r.waiters)):] {
			v.signal()
		}
	}
	return false
}

// blockedOn records that w found key full: from now on it holds back later
// waiters on that key only, so those on its other keys may try.
func (r *Registry[K]) blockedOn(w *waiter, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(w.blocked) == 1 && w.blocked[0] == key {
		return
	}
	w.blocked = []string{key}
	after := false
	for _, v := range r.waiters {
		if after {
			v.signal()
		}
		after = after || v == w
	}
}

// wokenBy wakes the first waiter held up by key: a lease on it was released
// somewhere in the fleet.
func (r *Registry[K]) wokenBy(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.waiters {
		if slices.Contains(v.blocked, key) {
			v.signal()
			return
		}
	}
}

// wakeAll lets every waiter look again (a limit changed, Redis came back).
func (r *Registry[K]) wakeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.waiters {
		v.signal()
	}
}

// jitter returns a duration in [d/2, d).
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}
