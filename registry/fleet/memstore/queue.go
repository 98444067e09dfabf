package memstore

import (
	"cmp"
	"math"
	"slices"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// key is a capped key: its leases and its queue.
type key struct {
	leases map[string]int64 // lease: expiry (ms)
	units  map[string]int   // lease: its units, if more than 1
	grants map[string]bool  // leases that are grants not claimed yet
	graced map[string]bool  // leases a grace moved, not extended by their holders since
	queue  []*place         // by class rank, then start tag, then sequence
	vt     [3]float64       // each class's virtual time: the start tag last granted
	finish map[flowKey]float64
	flows  map[string]int // tickets queued per flow
	// Per flow and class: its tickets queued, and the tag its turns are
	// charged from (the start of the first queued while it had none, moved
	// on to each granted ticket's finish), for a flow whose waiters leave
	// ungranted to get its turns back.
	queued map[flowKey]int
	base   map[flowKey]float64
	seq    int64
	// counted is count's answer at countedAt, kept until a lease changes
	// (changed): serving asks it at every waiter it looks at.
	counted, countedAt int64
	countedOK          bool
}

type flowKey struct {
	rank uint8
	flow string
}

// place is a ticket's place in one key's queue.
type place struct {
	t      *ticket
	tag    float64 // its start tag in its class, between flows
	finish float64 // its flow's finish tag once it was queued
	seq    int64
}

// ticket is a waiter: the lease id it will hold, on all of its keys.
type ticket struct {
	id, proc, flow string
	rank           uint8
	units          int   // what it weighs on each key, >= 1
	passed         int64 // units granted past it while it was a blocker (see serve)
	keys           []string
	limits         []int // its keys' limits, as its calls keep them
	expires        int64 // ms: a ticket nobody asks for goes
}

func (k *key) dropExpired(now int64) {
	for l, exp := range k.leases {
		if exp <= now {
			k.drop(l)
		}
	}
}

// hold sets lease's expiry: a lease held, not a grant (a claim, a renewal,
// a put back).
func (k *key) hold(lease string, exp int64) {
	k.leases[lease] = exp
	delete(k.grants, lease)
	delete(k.graced, lease)
	k.changed()
}

// changed forgets the count kept: a lease, its expiry or its units changed.
func (k *key) changed() { k.countedOK = false }

// weigh sets what lease weighs on k (units below 2: one).
func (k *key) weigh(lease string, units int) {
	if units > 1 {
		k.units[lease] = units
		k.changed()
	}
}

// unitsOf returns what lease weighs on k.
func (k *key) unitsOf(lease string) int {
	if u, ok := k.units[lease]; ok {
		return u
	}
	return 1
}

// drop takes lease off k.
func (k *key) drop(lease string) {
	delete(k.leases, lease)
	delete(k.units, lease)
	delete(k.grants, lease)
	delete(k.graced, lease)
	k.changed()
}

// started counts the units of k's leases held now, not the grants not
// claimed yet: the evidence of a learned cap (their requests are not at
// the upstream).
func (k *key) started(now int64) int {
	n := 0
	for l, exp := range k.leases {
		if exp > now && !k.grants[l] {
			n += k.unitsOf(l)
		}
	}
	return n
}

// count is k's count: the units of its leases not expired.
func (k *key) count(now int64) int {
	if k.countedOK && k.countedAt == now {
		return int(k.counted)
	}
	n := 0
	for l, exp := range k.leases {
		if exp > now {
			n += k.unitsOf(l)
		}
	}
	k.counted, k.countedAt, k.countedOK = int64(n), now, true
	return n
}

// earliest returns when k's earliest lease expires (0: none).
func (k *key) earliest(now int64) int64 {
	var e int64
	for _, exp := range k.leases {
		if exp > now && (e == 0 || exp < e) {
			e = exp
		}
	}
	return e
}

func (k *key) find(id string) int {
	return slices.IndexFunc(k.queue, func(p *place) bool { return p.t.id == id })
}

// queuedOn returns the ticket id queued on key (nil: none).
func (s *Store) queuedOn(name, id string) *ticket {
	if k := s.data.keys[name]; k != nil {
		if i := k.find(id); i >= 0 {
			return k.queue[i].t
		}
	}
	return nil
}

// unqueue takes t out of every key's queue: granted, or leaving without a
// grant (withdrawn, dropped). A flow is charged only for the turns it was
// granted: the newest of its waiters that leaves gives its turn back, and
// when its last waiter in a class leaves, its finish tag goes back to the
// finish of its last granted turn.
func (s *Store) unqueue(t *ticket, leaving bool) {
	fk := flowKey{t.rank, t.flow}
	for _, name := range t.keys {
		k := s.data.keys[name]
		if k == nil {
			continue
		}
		i := k.find(t.id)
		if i < 0 {
			continue
		}
		p := k.queue[i]
		k.queue = slices.Delete(k.queue, i, i+1)
		if k.flows[t.flow]--; k.flows[t.flow] <= 0 {
			delete(k.flows, t.flow)
		}
		switch {
		case !leaving && p.finish > k.base[fk]:
			k.base[fk] = p.finish
		case leaving && k.finish[fk] == p.finish && p.finish < driver.MaxTag: // at MaxTag, it may not be the newest
			k.finish[fk] = p.tag
		}
		if k.queued[fk]--; k.queued[fk] <= 0 {
			if leaving {
				k.finish[fk] = k.base[fk]
			}
			delete(k.queued, fk)
			delete(k.base, fk)
		}
		if len(k.queue) == 0 { // tags start from 0 after every backlog
			k.vt, k.seq = [3]float64{}, 0
			clear(k.finish)
			clear(k.base)
			clear(k.queued)
		}
	}
}

// enqueue places t on each of its keys: a flow's start tag in a class is
// its finish tag there or the class's virtual time, whichever is later,
// and its next finish tag is that plus the turn's cost per weight (see
// driver.TurnCost).
func (s *Store) enqueue(t *ticket, weight int) {
	for i, name := range t.keys {
		k := s.key(name)
		fk := flowKey{t.rank, t.flow}
		tag := max(k.vt[min(int(t.rank), 2)], k.finish[fk])
		finish := min(tag+float64(driver.TurnCost(t.units, t.limits[i]))/float64(max(weight, 1)), driver.MaxTag)
		k.finish[fk] = finish
		if k.queued[fk]++; k.queued[fk] == 1 {
			k.base[fk] = tag
		}
		k.seq++
		p := &place{t: t, tag: tag, finish: finish, seq: k.seq}
		i, _ := slices.BinarySearchFunc(k.queue, p, func(a, b *place) int {
			return cmp.Or(cmp.Compare(a.t.rank, b.t.rank), cmp.Compare(micro(a.tag), micro(b.tag)), cmp.Compare(a.seq, b.seq))
		})
		k.queue = slices.Insert(k.queue, i, p)
		k.flows[t.flow]++
	}
}

// limitFor returns t's limit on its i-th key as name's queue is served
// under limit: a ticket of one key takes the serving call's limit, one of
// several the lower of its own and the serving call's.
func limitFor(t *ticket, i int, name string, limit int) int {
	switch {
	case len(t.keys) == 1:
		return limit
	case t.keys[i] == name:
		return min(t.limits[i], limit)
	}
	return t.limits[i]
}

// canTake reports whether t can take room for its units on each of its
// keys now, with limit as name's limit (at most): room under its limit
// there, and, on its other keys, no heavy waiter before it in the queue.
func (s *Store) canTake(t *ticket, name string, limit int, now int64) bool {
	for i, kn := range t.keys {
		if s.key(kn).count(now)+t.units > limitFor(t, i, name, limit) {
			return false
		}
		if kn != name && s.behindHeavy(t, kn, now) {
			return false
		}
	}
	return true
}

// heavy reports whether t waits for room on name for its units as
// name's queue is served under limit: it has none there now, and its
// units are at most limit.
func (s *Store) heavy(t *ticket, name string, limit int, now int64) bool {
	return t.units <= limit && s.key(name).count(now)+t.units > limit
}

// behindHeavy reports whether a heavy waiter of more than one unit stands
// before t in name's queue, by its own limit there: the room it waits for
// is not t's to take, whichever key's queue is served. (A waiter of one
// unit without room means no room for t either, under the same limit.)
func (s *Store) behindHeavy(t *ticket, name string, now int64) bool {
	k := s.data.keys[name]
	if k == nil {
		return false
	}
	for _, p := range k.queue {
		u := p.t
		if u == t {
			return false
		}
		if u.units > 1 && s.heavy(u, name, u.limits[slices.Index(u.keys, name)], now) {
			return true
		}
	}
	return false
}

// serve grants name's waiters in order, while it has room under limit:
// each that can take room on all of its keys gets a lease of the claim
// window on each, and its process is told; a ticket of a dead process,
// or one nobody asked for in time, is dropped. A heavy waiter of one key
// is passed, up to its bound (see driver.ReleaseCall), by waiters of one
// key; serve stops at any other, or once it has looked at
// driver.PassScan waiters past the first it passed, and reports whether
// it did. blocker is the first heavy waiter it went past in its last
// look (nil: none), for a newcomer that passes it too.
func (s *Store) serve(name string, limit int, now, claim int64) (stopped bool, blocker *ticket) {
	k := s.data.keys[name]
	if k == nil {
		return false, nil
	}
	k.dropExpired(now)
	looked := 0
	for i := 0; i < len(k.queue) && k.count(now) < limit; {
		p := k.queue[i]
		t := p.t
		if blocker != nil {
			if looked++; looked > driver.PassScan {
				return true, nil
			}
		}
		switch {
		case s.dead(t.proc, now, claim) || t.expires <= now:
			s.unqueue(t, true)
		case s.canTake(t, name, limit, now) && (blocker == nil || len(t.keys) == 1):
			s.grant(t, now, claim)
			blocker.pass(t.flow, t.rank, t.units)
		case s.heavy(t, name, limit, now):
			if len(t.keys) > 1 || t.passed >= driver.PassFactor*int64(t.units) {
				return true, nil
			}
			blocker = cmp.Or(blocker, t)
			i++
			continue
		default:
			i++
			continue
		}
		i, blocker, looked = 0, nil, 0 // the queue changed: look again from its head
	}
	return false, blocker
}

// pass counts n units of a waiter of flow and rank granted past t (a
// nil t: none), as driver.Pass says.
func (t *ticket) pass(flow string, rank uint8, n int) {
	if t != nil {
		t.passed += driver.Pass(flow != t.flow || rank != t.rank, n)
	}
}

// grant gives t a lease of the claim window on each of its keys (one it
// holds already is not shortened), takes it out of their queues, moving
// each class's virtual time to its start tag there, and tells its
// process.
func (s *Store) grant(t *ticket, now, claim int64) {
	for _, name := range t.keys {
		k := s.key(name)
		if i := k.find(t.id); i >= 0 {
			r := min(int(t.rank), 2)
			if tag := k.queue[i].tag; tag > k.vt[r] {
				k.vt[r] = tag
				for fk, f := range k.finish { // passed: their next start is the virtual time anyway
					if fk.rank == t.rank && f <= tag {
						delete(k.finish, fk)
					}
				}
			}
		}
		if exp, ok := k.leases[t.id]; !ok {
			k.leases[t.id], k.grants[t.id] = now+claim, true
			k.weigh(t.id, t.units)
		} else if exp < now+claim {
			k.leases[t.id] = now + claim
			delete(k.graced, t.id)
		}
		k.changed()
	}
	s.unqueue(t, false)
	s.publish(t.proc, event{kind: granted, payload: t.id})
}

// micro is a start tag to the microunit, as the other stores sort tags:
// turns of flows that meet (ten of 1/10 against one of 1) go by arrival,
// whatever the sums' last bits.
func micro(tag float64) int64 { return int64(math.Round(tag * 1e6)) }
