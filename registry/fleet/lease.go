package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"slices"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	ikeys "github.com/inflight-go/inflight/internal/keys"
	"github.com/inflight-go/inflight/slots"
)

// lease is one admission's record: its keys in the store and id, and the Owner of
// its Slot's hold.
type lease[K comparable] struct {
	r        *Registry[K]
	id       string
	keys     []K
	names    []string    // its keys' names in the store
	units    int         // what it weighs on each key, >= 1
	limits   []int       // their limits at the admission
	local    *slots.Slot // the mirror in the local registry; nil for a bypass
	hold     *core.Hold  // the Slot's own hold: a copy of the Slot frees nothing
	degraded bool        // not in the store yet: admitted while the store was unavailable (guarded by r.mu)
	reported bool        // found missing and reported lost; guarded by r.mu
	// unmirrored: admitted by the store and held with no local slot, it is
	// counted in r.held.unmirrored until released. Guarded by r.mu.
	unmirrored bool
	// sent: a call that may put it (back) into the store was made, and may still
	// run: a release abandons it (with a tombstone) rather than just
	// removing it. Guarded by r.mu; never cleared.
	sent bool
	// epoch is the epoch under which it was last seen in the store (0: not
	// known to be there), for the renewal to tell a lease the store lost from
	// one that expired (see PROTOCOL.md). Guarded by r.mu.
	epoch int64

	// until is the latest not-after time (see clock.go) of the calls made
	// that may add it to the store under its id: before it, a call that failed
	// may still run. Guarded by r.mu once the lease is held.
	until int64

	// start is what the store told of its admission, for learned caps (no
	// counts: admitted outside the store); answered: Report has been called
	// for it (guarded by the learned caps' mu).
	start    start
	answered bool

	abandoned bool                    // a stand-in for a failed call's id, to be taken back (abandonScript)
	since     time.Time               // when its removal was first queued (guarded by r.remMu)
	cancel    context.CancelCauseFunc // from WithCancelOnLost; nil without
}

// abandonment is a stand-in for l's current id, to be taken back with a
// tombstone.
func (l *lease[K]) abandonment() *lease[K] {
	return &lease[K]{r: l.r, id: l.id, names: l.names, limits: slices.Clone(l.limits), until: l.until, abandoned: true}
}

// Release implements core.Owner: it frees the local mirror at once and
// queues the removal from the store. It does not wait for the store, but
// once Close has stopped the releaser, when it removes the lease itself
// (removeAfterStop), within a call timeout.
func (l *lease[K]) Release(h *core.Hold) bool {
	if h != l.hold {
		l.Misuse(h) // a copied Slot: it holds nothing
		return false
	}
	if h.Bypassed {
		return true
	}
	held := time.Now().UnixNano() - h.At
	l.r.holdTime.Observe(held)
	l.r.holds.observe(l.names, held)
	if o := l.r.cfg.observer; o != nil {
		defer func() { // once released, even if Enabled panics
			if l.r.cfg.wants(nil) {
				o.Observe(slots.Event{Kind: slots.EventReleased, Hold: time.Duration(max(held, 0)), Units: h.Units()})
			}
		}()
	}
	out, wake, limitPanic := l.releasing()
	if l.r.releaseHook != nil {
		l.r.releaseHook()
	}
	func() {
		if out != nil { // even if the local release panics (an Observer)
			defer l.r.queueRelease(out)
		}
		// Once its local room is free: a waiter woken before would find
		// the key full still, and sleep out its backoff. The breaker is
		// read again: one that opened since releasing read it woke the
		// fleet's waiters (backInLine) before the room was free.
		defer func() {
			if wake || l.r.brk.open() {
				for _, name := range l.names {
					l.r.wokenBy(name)
				}
			}
		}()
		l.releaseLocal()
	}()
	if limitPanic != nil {
		panic(limitPanic) // the LimitFunc's, once the lease is on its way out
	}
	return true
}

// minRemade is the peak below which a shrunk map (or queue) is kept as it
// is (keys.Remade): remaking a small one gains little.
const minRemade = 1024

// remade is keys.Remade with minRemade.
func remade[M ~map[K]V, K comparable, V any](m M, peak *int) M {
	return ikeys.Remade(m, peak, minRemade)
}

// releasing drops l from the held leases and returns what to remove from
// the store (nil: nothing), whether to wake this process's waiters on its
// keys once its local mirror is freed, and what the LimitFunc panicked
// with, if it did.
func (l *lease[K]) releasing() (out *lease[K], wake bool, limitPanic any) {
	r := l.r
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held.leases, l)
	r.held.leases = remade(r.held.leases, &r.held.leasesPeak)
	if l.degraded {
		delete(r.held.degraded, l)
		r.held.degraded = remade(r.held.degraded, &r.held.degradedPeak)
		r.held.admittedOutside(l, -1)
	}
	if l.unmirrored {
		r.held.unmirror(l, -1)
	}
	// While the store cannot be reached, the waiters of this process wait
	// for its local room under the local registry, and the fleet's queue,
	// which its removal serves, wakes none of them; nor, while this
	// process holds or is admitting a lease outside the store, a waiter the
	// store admitted and that gave its lease back for that one
	// (outsideMeanwhile; that lease's going into the store wakes it: see
	// givenBack).
	wake = l.degraded || r.brk.open() || len(r.held.outside) > 0
	// A degraded lease is not in the store: nothing to remove. After Close
	// nothing is sent: the lease expires after the TTL.
	if (l.degraded && !l.sent) || r.closed {
		return nil, wake, nil
	}
	// The wake-up is for a key full by its limit now or, if the LimitFunc
	// panics, by its limit at the admission.
	old := slices.Clone(l.limits)
	func() {
		done := false
		defer func() {
			if !done {
				limitPanic = recover()
				l.limits = old
			}
		}()
		r.limitsLocked(l)
		done = true
	}()
	if l.sent {
		return l.abandonment(), wake, limitPanic // a renewal may still put it back
	}
	return l, wake, limitPanic
}

func (l *lease[K]) releaseLocal() {
	if l.local != nil {
		l.local.Release()
	}
}

// Misuse implements core.Owner: a Release of a slot released already.
func (l *lease[K]) Misuse(*core.Hold) {
	l.r.stats.doubleReleases.Add(1)
	if o := l.r.cfg.observer; o != nil && l.r.cfg.wants(nil) {
		o.Observe(slots.Event{Kind: slots.EventDoubleRelease})
	}
}

// Time implements core.Owner.
func (l *lease[K]) Time(at int64) time.Time { return time.Unix(0, at) }

// Log implements core.Owner.
func (l *lease[K]) Log() *slog.Logger { return l.r.cfg.log() }

func newLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
