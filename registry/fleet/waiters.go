package fleet

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/inflight-go/inflight/internal/keys"
)

// waiter is one caller of this process waiting in Acquire.
type waiter struct {
	rank   uint8 // its priority class's rank (core.Rank): lower goes first
	flow   string
	weight int      // its flow's weight, >= 1
	units  int      // what it weighs on each key
	keys   []string // its keys in the store
	// ticket is the lease id under which it last asked the store ("": never);
	// guarded by r.waits.mu.
	ticket string
	// queuedAs is the lease id under which a reply last told it queued
	// ("": never, or it left the queue since), in queuedEpoch; its own
	// goroutine's.
	queuedAs    string
	queuedEpoch int64
	// blocked are the keys on which it holds back later waiters: all of its
	// keys until it has been told one is full, then that key alone; none
	// once its call to the store has its place in line (see placed), until a
	// reply tells it a key is full again. Guarded by r.waits.mu.
	blocked []string
	queued  bool // in r.waits.queues (guarded by r.waits.mu)
	// waiting: it holds a place in a queue, the fleet's (queuedIn) or this
	// process's order while the store cannot be reached (lineUp), and
	// counts against the queue's bounds there. Guarded by r.waits.mu.
	waiting bool
	// inLine: it waits in this process's order for its blocked keys, told
	// a key was full (or held back by an earlier waiter), until its next
	// try begins; not one that has not been told yet, which may be taking
	// the room now. Also, from the breaker's opening until its next try,
	// one that held a place in the fleet's queue (backInLine), even if its
	// call to the store is still out: newcomers leave it the room until
	// that call ends (within a call timeout). Guarded by r.waits.mu.
	inLine bool
	// local: in line (see inLine) for a key full under the local registry
	// (the store unreachable), or behind a waiter that is: its place
	// counts against the local queue bounds (see lineUp); not one told of
	// a pause, which waits through it whatever the bounds, as it would
	// in the store. Guarded by r.waits.mu.
	local bool
	// fleet: the key the store last told it full as it holds a place in
	// the fleet's queue (queuedIn; "": none), or held one and asks again
	// (its call out), until the store admits it, it is decided outside the
	// store, or its call times out once sent, which gives its place back
	// (see leftFleet): a newcomer whose call failed leaves it the room of that
	// key (waitedOn), which it could take; not of its other keys, on which
	// a newcomer in the store passes a waiter that cannot take the room.
	// Guarded by r.waits.mu; set by its own goroutine alone.
	fleet string
	// outside: given back for a lease admitted outside the store (see
	// givenBack), until its next try. Guarded by r.waits.mu.
	outside bool
	wake    chan struct{} // buffered 1
	// granted is the ticket whose grant's wake-up it was sent ("": none);
	// guarded by r.waits.mu. Its calls under that ticket, claims, go in
	// the claims' lane (see Registry.call), again after one that failed or
	// came too late, until the store answers that the grant is gone.
	granted string
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// The fleet's queue in the store orders the waiters of every process (see
// PROTOCOL.md). Before a waiter is queued there, and while it cannot be (new
// admissions paused, the store unreachable), it waits in this process's own
// order, which the rest of this file keeps.
//
// The waiters are kept in a queue per key (r.waits.queues), each in the one
// order of the process: by class, then arrival. Every decision about a
// waiter looks only at the queues of its own keys, and a change wakes only
// the waiters it may let go, so that a burst of waiters leaving in order
// (as they are admitted) costs time in proportion to its size, not its
// square: the next waiter on a key is at the front of that key's queue,
// and the first waiter there that holds the key back ends a search.

func (r *Registry[K]) enqueue(w *waiter) error {
	r.mu.Lock() // Close wakes the waiters after it sets closed: w is seen, or sees it
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	if r.waits.queues == nil {
		r.waits.queues = map[string][]*waiter{}
	}
	w.blocked, w.queued = w.keys, true
	for _, k := range w.keys {
		// After every waiter of its class or a higher one: by class, then
		// in arrival order.
		q := r.waits.queues[k]
		i := len(q)
		for i > 0 && q[i-1].rank > w.rank {
			i--
		}
		r.waits.queues[k] = slices.Insert(q, i, w)
	}
	r.waits.waiting++
	r.waits.queuesPeak = max(r.waits.queuesPeak, len(r.waits.queues))
	return nil
}

// dequeue removes w and lets the waiters it held back look again.
func (r *Registry[K]) dequeue(w *waiter) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	if !w.queued {
		return
	}
	r.setLineLocked(w, false, w.waiting)
	w.queued = false
	r.waits.waiting--
	if w.ticket != "" && r.waits.tickets[w.ticket] == w {
		delete(r.waits.tickets, w.ticket)
		r.waits.tickets = remade(r.waits.tickets, &r.waits.ticketsPeak)
	}
	for _, k := range w.keys {
		q := r.waits.queues[k]
		i := slices.Index(q, w)
		if i < 0 {
			continue
		}
		if i == 0 { // the usual case: without moving the rest
			q[0] = nil
			q = q[1:]
		} else {
			q = slices.Delete(q, i, i+1)
		}
		if q = keys.Trimmed(q, minRemade); q == nil {
			delete(r.waits.queues, k)
			continue
		}
		r.waits.queues[k] = q
		if slices.Contains(w.blocked, k) {
			freeLocked(q, i, k)
		}
	}
	r.waits.queues = remade(r.waits.queues, &r.waits.queuesPeak)
}

// freeLocked wakes the waiters of q, key's queue, that no longer find key
// held back by a waiter at position i (that has left q, or no longer holds
// key back): those from i on, up to the first that holds key back itself.
// None is woken if a waiter before i holds key back.
func freeLocked(q []*waiter, i int, key string) {
	for _, v := range q[:i] {
		if slices.Contains(v.blocked, key) {
			return
		}
	}
	for _, v := range q[i:] {
		v.signal()
		if slices.Contains(v.blocked, key) {
			return
		}
	}
}

// setLineLocked sets w's inLine and waiting, and keeps count of the
// queued waiters in line without a place (r.waits.unlined).
func (r *Registry[K]) setLineLocked(w *waiter, inLine, waiting bool) {
	before := w.queued && w.inLine && !w.waiting
	w.inLine, w.waiting = inLine, waiting
	switch after := w.queued && w.inLine && !w.waiting; {
	case before && !after:
		r.waits.unlined--
	case after && !before:
		r.waits.unlined++
	}
}

// reblockLocked makes blocked the keys on which w holds back later waiters,
// and wakes those it no longer holds back.
func (r *Registry[K]) reblockLocked(w *waiter, blocked []string) {
	old := w.blocked
	w.blocked = blocked
	for _, k := range old {
		if !slices.Contains(blocked, k) {
			q := r.waits.queues[k]
			freeLocked(q, slices.Index(q, w)+1, k)
		}
	}
}

// mayTry reports whether w may ask the store now: no earlier waiter of this
// process holds back any of its keys. If some do, w from then on holds back
// later waiters on those keys alone, not on its others; held is then the
// index of the first of w's keys held back by a waiter in line for the
// local registry (told the key was full there, the store unreachable: see
// local), -1 if none: not a pause's, which bounds no queue.
func (r *Registry[K]) mayTry(w *waiter) (ok bool, held int) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	var ahead []string // w's keys held back by earlier waiters, in w's order
	held = -1
	for i, k := range w.keys {
		for _, v := range r.waits.queues[k] {
			if v == w {
				break
			}
			if slices.Contains(v.blocked, k) {
				ahead = append(ahead, k)
				if held < 0 && v.inLine && v.local {
					held = i
				}
				break
			}
		}
	}
	if len(ahead) == 0 {
		return true, -1
	}
	r.setLineLocked(w, true, w.waiting)
	w.local = held >= 0
	if !slices.Equal(ahead, w.blocked) {
		r.reblockLocked(w, ahead)
	}
	return false, held
}

// lineUp takes w's place in this process's order, which it waits in for
// its keys from full on (the first of its keys that was full under the
// local registry, or held back by a waiter in line there), or returns the
// index of the first of those keys whose waiters here are at the queue's
// bound (slots.WithMaxQueue) or w's flow's (WithMaxQueuePerFlow), and
// their count: while the local caps are the caps, their bounds are the
// bounds, as in a local registry. A waiter that holds a place already (in
// the fleet's queue too) keeps it.
func (r *Registry[K]) lineUp(w *waiter, full int) (key, queued int) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	if w.waiting || r.maxQueue < 0 && r.maxFlowQueue < 0 {
		r.setLineLocked(w, w.inLine, true)
		return -1, 0
	}
	for j := range w.keys {
		i := (full + j) % len(w.keys)
		n, f := 0, 0
		for _, v := range r.waits.queues[w.keys[i]] {
			if v != w && v.waiting {
				n++
				if v.flow == w.flow {
					f++
				}
			}
		}
		switch {
		case r.maxQueue >= 0 && n >= r.maxQueue:
			return i, n
		case r.maxFlowQueue >= 0 && f >= r.maxFlowQueue:
			return i, f
		}
	}
	r.setLineLocked(w, w.inLine, true)
	return -1, 0
}

// placed records that w's call to the store has its place in line, before the
// calls of any waiter after it (see calls): w holds back no later waiter
// until a reply tells it a key is full. Their calls follow its own in the
// same pipeline or the next, rather than each waiting for the reply before
// it: a process sends a burst on one key in pipelines, one round trip
// each.
func (r *Registry[K]) placed(w *waiter) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	if w.queued && len(w.blocked) > 0 {
		r.reblockLocked(w, nil)
	}
}

// blockedOn records that w found key full (under the local registry, if
// local: see waiter.local): from now on it holds back later waiters on
// that key only, so those on its other keys may try. If local, the
// waiters it held back on key that have not taken their places in line
// (see lineUp) are woken to take them now, in their order, before a
// waiter that comes after them does.
func (r *Registry[K]) blockedOn(w *waiter, key string, local bool) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	r.setLineLocked(w, true, w.waiting)
	w.local = local
	if local && (r.maxQueue >= 0 || r.maxFlowQueue >= 0) && r.waits.unlined > 0 {
		q := r.waits.queues[key]
		for _, v := range q[slices.Index(q, w)+1:] {
			if v.inLine && !v.waiting {
				v.signal()
			}
		}
	}
	if len(w.blocked) == 1 && w.blocked[0] == key {
		return
	}
	r.reblockLocked(w, []string{key})
}

// expect records that w asks the store as ticket, so that a grant published
// as soon as its call queues it finds it; before the call, since the grant
// may come before its reply.
func (r *Registry[K]) expect(w *waiter, ticket string) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	r.setLineLocked(w, false, w.waiting) // trying: it may take the room itself
	w.outside = false
	if !w.queued || w.ticket == ticket {
		return
	}
	if r.waits.tickets[w.ticket] == w {
		delete(r.waits.tickets, w.ticket)
	}
	if r.waits.tickets == nil {
		r.waits.tickets = map[string]*waiter{}
	}
	w.ticket = ticket
	r.waits.tickets[ticket] = w
	r.waits.ticketsPeak = max(r.waits.ticketsPeak, len(r.waits.tickets))
}

// queuedIn records that w waits in the fleet's queue as ticket: it holds
// back no later waiter of this process, since the fleet's queue orders
// them, and withdraws its place if it gives up.
func (r *Registry[K]) queuedIn(w *waiter, ticket, full string) {
	w.queuedAs = ticket
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	r.setLineLocked(w, w.inLine, true)
	w.fleet = full
	if w.queued && len(w.blocked) > 0 {
		r.reblockLocked(w, nil)
	}
}

// givenBack records that w, which the store admitted, gave its lease back
// for a lease this process admitted outside the store (outsideMeanwhile),
// and waits outside the fleet's queue until its next try. A release here
// wakes it while that lease is outside the store (see releasing); once the
// lease goes in (a renewal, a call that carried it), the releases that
// free its room may wake no one here, and the fleet's queue does not know
// w: the lease's going in wakes it (wentIn), to ask again and queue there.
// It reports whether a lease went in since seen (heldLeases.wentIn as the
// store decided): that wake-up came before w was recorded, and passed it by.
func (r *Registry[K]) givenBack(w *waiter, seen uint64) bool {
	r.waits.mu.Lock()
	w.outside = true
	r.waits.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held.wentIn != seen
}

// wentIn wakes the waiters given back (see givenBack) on the keys of l, a
// lease admitted outside the store that is in it now: a look at the
// waiters of l's keys, once per lease put in after an outage. Called with
// r.mu held.
func (r *Registry[K]) wentIn(l *lease[K]) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	for _, name := range l.names {
		for _, v := range r.waits.queues[name] {
			if v.outside {
				v.signal()
			}
		}
	}
}

// wokenBy wakes the first waiter held up by key: a lease on it was
// released that the fleet's queue does not see (one admitted under the
// local registry alone while the store was unreachable).
func (r *Registry[K]) wokenBy(key string) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	for _, v := range r.waits.queues[key] {
		if slices.Contains(v.blocked, key) {
			v.signal()
			return
		}
	}
}

// waitedOn reports whether a newcomer of units, which finds free units of
// key under the local registry (at least its units), is to leave them to
// this process's waiters in line for key (see inLine), or holding a place
// in the fleet's queue on key, the key the store told them full, and
// holding back no key here (see fleet; the breaker still closed, the
// newcomer's own call failed): they take them first, in turn;
// a heavy one (its units more than what is left) keeps them, as a
// newcomer that does not wait passes no heavy waiter (PROTOCOL.md,
// Waiting). It wakes the first that fits, so that it takes the room now
// (a release the store admitted before the breaker opened woke none; one
// in the fleet's queue asks the store again, and takes the room here if
// that call fails otherwise than by a timeout), and returns how many
// waiters it counted.
func (r *Registry[K]) waitedOn(key string, free, units int) (n int, ok bool) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	woke := false
	for _, v := range r.waits.queues[key] {
		if !(v.inLine && slices.Contains(v.blocked, key)) && !(v.fleet == key && len(v.blocked) == 0) {
			continue
		}
		n++
		if v.units > free {
			return n, true
		}
		free -= v.units
		if !woke {
			v.signal()
			woke = true
		}
	}
	return n, n > 0 && free < units
}

// granted wakes the waiter queued as ticket: the fleet's queue granted it.
func (r *Registry[K]) granted(ticket string) {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	if w := r.waits.tickets[ticket]; w != nil {
		w.granted = ticket
		w.signal()
	}
}

// wakeAll lets every waiter look again (a limit changed, the store came back,
// the Registry closed).
func (r *Registry[K]) wakeAll() {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	for _, q := range r.waits.queues {
		for _, v := range q {
			v.signal()
		}
	}
}

// backInLine puts back in this process's order the waiters that hold back
// none of their keys (queued in the fleet's queue, or their calls placed
// there), and wakes every waiter: the store cannot be reached, and the
// fleet's queue no longer orders them. Else the room a release frees
// under the local registry would go to whichever of them runs first.
// Those that held a place in the fleet's queue, told a key was full,
// are in line here (see inLine) until their next try: a newcomer that
// comes before it leaves them the room (waitedOn).
func (r *Registry[K]) backInLine() {
	r.waits.mu.Lock()
	defer r.waits.mu.Unlock()
	for _, q := range r.waits.queues {
		for _, v := range q {
			if len(v.blocked) == 0 {
				v.blocked = v.keys
				if v.waiting {
					r.setLineLocked(v, true, true)
					v.local = false // not told full here yet: see local
				}
			}
			v.signal()
		}
	}
}

// jitter returns a duration in [d/2, d).
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}
