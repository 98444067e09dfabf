package fleet

// Admissions while the store cannot be reached (the breaker is open, or a
// call failed), as WithUnavailable says.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// bypass admits l with a Bypassed Slot that holds nothing (Degraded too if
// the store is unavailable).
func (r *Registry[K]) bypass(l *lease[K], degraded bool) outcome {
	x := new(core.Handle)
	h := x.Hold()
	h.Owner, l.hold = l, h
	h.At = time.Now().UnixNano()
	h.Bypassed, h.Degraded, h.Extra = true, degraded, int32(l.units-1)
	r.stats.bypassed.Add(1)
	return outcome{slot: (*slots.Slot)(x), full: -1}
}

// unqueued is unavailable for l, waiting as w, after its call was not
// made or failed: it may be admitted outside the store, so w, if queued
// under l's id, leaves the fleet's queue first and l takes a new id, which
// the ticket's tombstone does not keep out when it is put back.
func (r *Registry[K]) unqueued(ctx context.Context, l *lease[K], w *waiter) outcome {
	if r.leaveQueue(l, w) {
		l.id = newLeaseID() // l is not shared yet
	}
	r.leftFleet(w)
	if w == nil && r.cfg.onUnavailable == FallbackLocal {
		// A newcomer does not pass this process's waiters, which wait
		// in its own order while the store cannot be reached, nor, its
		// own call failed, those waiting in the fleet's queue.
		if o, ok := r.waitedFor(l); ok {
			return o
		}
	}
	return r.unavailable(ctx, l)
}

// leftFleet records that w, if not nil, no longer waits in the fleet's
// queue: the store admitted it, or it is decided outside the store, and
// it may be taking its room here now. Called by w's own goroutine, the
// only one that sets w.fleet: it reads it without the lock.
func (r *Registry[K]) leftFleet(w *waiter) {
	if w == nil || w.fleet == "" {
		return
	}
	r.waits.mu.Lock()
	w.fleet = ""
	r.waits.mu.Unlock()
}

// waitedFor returns the refusal of newcomer l if, on one of its keys, the
// room it finds under the local registry is for this process's waiters in
// line there (see waitedOn); a key without room for it is left to the
// local registry to refuse.
func (r *Registry[K]) waitedFor(l *lease[K]) (outcome, bool) {
	for i, k := range l.keys {
		n, limit := r.localHeld(k), r.local.Limit(k)
		if limit-n < l.units {
			continue
		}
		queued, ok := r.waitedOn(l.names[i], limit-n, l.units)
		if !ok {
			continue
		}
		le := &slots.LimitError{Err: slots.ErrLimitReached, Key: l.names[i], InFlight: n, Limit: limit, Queued: queued, RetryAfter: time.Second}
		return outcome{err: le, full: i, inFlight: n, queuedN: queued}, true
	}
	return outcome{}, false
}

// fallbackAcquire takes l's slot in the local registry, whose caps are
// the caps while the store cannot be reached (FallbackLocal). The leases
// held without a slot there (heldLeases.unmirrored), and the store's
// admissions on their way to it, count as held: else, once the local
// limit has caught up with the raised one the store admitted them under,
// the local registry would admit past it. They are counted after the
// local admission, not before: it fetches the key's
// limit when due (a count before it would read a stale limit, and keep
// it stale while they are held), and admissions made at the same time
// then count one another: they may all give their room back, but never
// keep more than there is.
func (r *Registry[K]) fallbackAcquire(l *lease[K]) (*slots.Slot, error) {
	s, err := r.local.TryAcquireAllN(l.units, l.keys...)
	if err != nil {
		return nil, err
	}
	for i, k := range l.keys {
		if n, limit := r.localHeld(k), r.local.Limit(k); n > limit {
			s.Release()
			le := &slots.LimitError{Err: slots.ErrLimitReached, Key: r.keyName(k), InFlight: n - l.units,
				Limit: limit, RetryAfter: time.Second}
			le.RetryAfter = r.refusalRetryAfter(l, i, le, 0, 0, 0, true) // from the key's holds, as the store's refusals
			return nil, le
		}
	}
	return s, nil
}

// outsideMeanwhile gives l back, which the store admitted, and returns
// its refusal, if on one of its keys this process holds a lease admitted
// outside the store, or is admitting one, and with l more than the local
// limit and the limit the store admitted l under (see hold). local is l's
// local slot (nil: the local registry refused it, with le, and l is
// counted among the leases held without one). A lease outside the store
// when the store decided, and put into it since by another call or a
// renewal, counts too, though outside no longer counts it: seen is
// heldLeases.wentIn as the store decided, with the leases l's own call
// put in; any other put in since makes each of l's keys checked.
func (r *Registry[K]) outsideMeanwhile(l *lease[K], local *slots.Slot, le *slots.LimitError, seen uint64) (outcome, bool) {
	for i, k := range l.keys {
		if !r.outsideOn(k, seen) { // none, as a rule: nothing more to read
			continue
		}
		n := r.localHeld(k) - l.units // without its own, counted either way
		if n+l.units <= r.local.Limit(k) || n+l.units <= l.limits[i] {
			continue
		}
		func() {
			defer r.takeBack(l) // even if the local release panics (an Observer)
			if local != nil {
				local.Release()
			}
		}()
		err := &slots.LimitError{Err: slots.ErrLimitReached, Key: l.names[i], InFlight: n, Limit: l.limits[i], RetryAfter: time.Second}
		if le != nil {
			err.Err, err.RetryAfter = le.Err, le.RetryAfter
		} else {
			err.RetryAfter = r.refusalRetryAfter(l, i, err, 0, 0, 0, true) // from the key's holds, as the store's refusals
		}
		return outcome{err: err, full: i, inFlight: n, outside: true, seen: seen}, true
	}
	return outcome{}, false
}

// outsideOn reports whether this process holds a lease admitted outside
// the store, not in it yet, on key k, or is admitting one; or whether one
// went into the store since heldLeases.wentIn was seen (on any key). Both
// are read at once: a lease that goes in leaves outside as wentIn counts it.
func (r *Registry[K]) outsideOn(k K, seen uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held.outside[k] > 0 || r.held.wentIn != seen
}

// localHeld returns the units this process holds on k as FallbackLocal
// counts them: the local registry's, and those of the leases held without
// a slot there.
func (r *Registry[K]) localHeld(k K) int {
	r.mu.Lock()
	n := r.held.unmirrored[k]
	r.mu.Unlock()
	return n + r.local.InFlight(k)
}

// unavailable admits l, or not, while the store cannot be reached.
func (r *Registry[K]) unavailable(ctx context.Context, l *lease[K]) outcome {
	switch r.cfg.onUnavailable {
	case FailClosed:
		return failed(r.brk.refusal(r.cfg.probeEvery, ""))
	case FailOpen:
		if err := ctx.Err(); err != nil {
			return failed(fmt.Errorf("fleet: acquire: %w", err))
		}
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		if closed {
			return failed(ErrClosed)
		}
		return r.bypass(l, true)
	}
	return r.hold(ctx, l, true, 0, 0)
}

// timedOut reports whether err is a call's timeout: the call's own
// deadline, a network timeout, or a queued call not sent in time.
func timedOut(err error) bool {
	var t interface{ Timeout() bool }
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errQueueTimeout) || errors.As(err, &t) && t.Timeout()
}

func (r *Registry[K]) storeFailed(err error) {
	if r.stopping.Err() != nil {
		return // Close cancelled it: not the store's failure
	}
	r.stats.storeErrors.Add(1)
	if r.brk.failure() {
		// The waiters queued in the store, which hold back nothing here,
		// ask again at once, in this process's order under the local
		// registry, rather than after their claim window. Before the log,
		// which may take its time: a newcomer meanwhile would pass them.
		r.backInLine()
		r.logSafely(slog.LevelWarn, "fleet: store unavailable; breaker open", slog.String("registry", r.prefix), slog.Any("error", err))
	}
}

// UnavailableError is the error of a call refused because the store
// cannot be reached: an admission under FailClosed, a Budget's charge. It
// wraps ErrUnavailable. slots.HTTPStatus answers it 503 with its
// RetryAfter.
type UnavailableError struct {
	after time.Duration
	msg   string // what could not be done, after ErrUnavailable's text
}

func (e *UnavailableError) Error() string { return ErrUnavailable.Error() + e.msg }

func (e *UnavailableError) Unwrap() error { return ErrUnavailable }

// RetryAfter is when to try again, estimated from how long the store has
// failed so far: as long again (an outage that has lasted is likely to
// last a while more), at least the Registry's probe interval (the soonest
// it may find the store back; 250 ms for a Budget, which keeps no record
// of the store's earlier calls) and at most 30 s or that interval, spread
// over half as long again, so that callers refused together do not come
// back together. It runs on the wall clock: a clock set forward meanwhile
// makes it longer, to that bound.
func (e *UnavailableError) RetryAfter() time.Duration { return e.after }

// maxOutageRetry bounds an UnavailableError's RetryAfter.
const maxOutageRetry = 30 * time.Second

// outage keeps when the store's calls began to fail in a row (unix ns; 0:
// the last call was answered).
type outage struct{ since atomic.Int64 }

// failed counts a failed call.
func (o *outage) failed() { o.since.CompareAndSwap(0, time.Now().UnixNano()) }

// answered counts a call the store answered: the outage, if any, is over.
func (o *outage) answered() { o.since.Store(0) }

// refusal is the UnavailableError of a call refused now, msg saying what
// it was, with a RetryAfter of at least floor (see RetryAfter).
func (o *outage) refusal(floor time.Duration, msg string) *UnavailableError {
	d := floor
	if since := o.since.Load(); since != 0 {
		d = max(time.Since(time.Unix(0, since)), floor)
	}
	d = min(d, max(maxOutageRetry, floor))
	// The spread stops at the longest Duration: a floor near it (a probe
	// interval of math.MaxInt64, never in effect) would overflow.
	return &UnavailableError{after: d + min(rand.N(d/2+1), math.MaxInt64-d), msg: msg}
}
