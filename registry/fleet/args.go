package fleet

import (
	"slices"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// What an acquire call sends: its keys and arguments, and the degraded
// leases it carries back into the store.

// maxCarried bounds the (key, lease) pairs of degraded leases that one
// admission carries into the store (see carryLocked).
const maxCarried = batchSize

// acquireCall is an admission call: what it sends, its not-after time,
// and the degraded leases it carries.
type acquireCall[K comparable] struct {
	call    *driver.AdmitCall
	until   int64
	carried []*lease[K]
	learned bool // a key is learned: an admission's reply tells its start
	// epoch is the epoch the call carries (0: this process has had no
	// reply from the store yet).
	epoch int64
	// wentIn is heldLeases.wentIn as the call was made: a lease put into
	// the store since, but by the call itself, may not have counted
	// against its admission (see outsideMeanwhile).
	wentIn uint64
}

// lateSpan is how long after it is made a call may still be running as a
// caller waits for it: the call timeout, twice for a call queued for a
// pipeline.
func (r *Registry[K]) lateSpan() time.Duration { return 2 * r.cfg.opTimeout }

// scriptArgs returns the admission call for l, waiting as w if not nil, or
// ErrClosed.
func (r *Registry[K]) scriptArgs(l *lease[K], w *waiter) (acquireCall[K], error) {
	r.mu.Lock()
	defer r.mu.Unlock() // a LimitFunc that panics must not leave it locked
	if r.closed {
		return acquireCall[K]{}, ErrClosed
	}
	r.limitsLocked(l)
	if err := r.tooHeavyLocked(l); err != nil {
		return acquireCall[K]{}, err
	}
	c := acquireCall[K]{until: r.clock.notAfter(r.lateSpan()), epoch: r.epoch.Load(), wentIn: r.held.wentIn}
	c.call = &driver.AdmitCall{
		Lease: l.id, Keys: l.names, Limits: slices.Clone(l.limits),
		TTL: r.cfg.ttl, NotAfter: scriptUntil(c.until), Epoch: c.epoch, Pause: r.pause,
		Units: l.units, Claim: r.claim, Live: r.live, Weight: 1, Proc: r.proc,
		MaxQueue: r.maxQueue, MaxFlowQueue: r.maxFlowQueue,
	}
	if w != nil {
		c.call.Wait, c.call.Class, c.call.Flow, c.call.Weight = true, w.rank, w.flow, w.weight
	}
	if r.learned.anyOf(l.keys) {
		c.call.Starts = true // the reply tells what a learned cap needs
		c.learned = true
	}
	if len(r.held.degraded) > 0 {
		r.carryLocked(l, &c)
	}
	return c, nil
}

// carryLocked adds to c the leases this process admitted while the store
// was unreachable and that share a key with l: c puts them into the store
// before it decides, so that they count against l. Past maxCarried pairs
// the rest are left to the heartbeat, woken for them.
func (r *Registry[K]) carryLocked(l *lease[K], c *acquireCall[K]) {
	pairs := 0
	for d := range r.held.degraded {
		if !slices.ContainsFunc(d.names, func(n string) bool { return slices.Contains(l.names, n) }) {
			continue
		}
		if pairs+len(d.names) > maxCarried {
			r.recovered()
			return
		}
		d.sent = true // the call may run after d is released: abandon d then
		d.until = max(d.until, c.until)
		for _, name := range d.names {
			c.call.Carried = append(c.call.Carried, driver.Pair{Key: name, Lease: d.id, Units: d.units})
		}
		c.carried = append(c.carried, d)
		pairs += len(d.names)
	}
}

// carriedIn records that the carried leases are in the store, under epoch. One
// released meanwhile was abandoned (it was marked sent): its tombstone kept
// it out, or its removal takes it out. It returns how many it put in
// (heldLeases.wentIn).
func (r *Registry[K]) carriedIn(carried []*lease[K], epoch int64) (n uint64) {
	if len(carried) == 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range carried {
		if _, live := r.held.leases[d]; live && d.degraded {
			r.inStoreLocked(d, epoch)
			r.stats.reasserted.Add(1)
			n++
		}
	}
	return n
}

// inStoreLocked records that l is in the store under epoch.
func (r *Registry[K]) inStoreLocked(l *lease[K], epoch int64) {
	if l.degraded {
		l.degraded = false
		delete(r.held.degraded, l)
		r.held.degraded = remade(r.held.degraded, &r.held.degradedPeak)
		r.held.admittedOutside(l, -1)
		r.held.wentIn++
		r.wentIn(l)
	}
	l.epoch, l.reported = epoch, false
}
