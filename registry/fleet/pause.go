package fleet

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/inflight-go/inflight/slots"
)

// ErrPaused is the reason of a *slots.LimitError given while new
// admissions wait after the store lost its data (see the package
// documentation): errors.Is finds it, and slots.ErrLimitReached, which it
// wraps, so that an HTTP layer answers it as any refusal at the cap, with a
// Retry-After from the end of the pause (see PROTOCOL.md).
var ErrPaused = fmt.Errorf("fleet: admissions paused after the store lost its data: %w", slots.ErrLimitReached)

// CapPaused is the Cap of ErrPaused's refusals: slots.ErrorMessage tells
// a client of a pause, not of a count in flight, which says little of the
// key's room during it.
const CapPaused = "fleet_pause"

// pauseFor returns how long new admissions wait after the store lost its data,
// as a Registry with cfg declares it (see PROTOCOL.md): until every live
// holder has renewed once. The heartbeat renews every TTL/3, so each
// holder's next renewal starts within TTL/3 of the loss being found; the
// margin is for its calls to end: each is bounded by the call timeout, and
// it may take two (a call refused as late is made once more, and an open
// breaker's probe pings before it renews). At most the TTL, as the call
// timeout is at most TTL/3.
//
// A Registry that puts no lost lease back (ReportLost, CancelLost) declares
// the pause too: its own holders do not come back, but those of the
// processes that do may be live, and it may be the first to find the loss.
func pauseFor(cfg config) time.Duration {
	return min(cfg.ttl/3+2*cfg.opTimeout, cfg.ttl)
}

// sawEpoch records epoch, told by a reply, and reports whether it replaced
// another one: the store lost its data since this process last heard from it.
// Only a later epoch replaces an earlier one (an epoch is the server's time
// at its making), so that a reply that comes late, from before the loss,
// does not make the loss seem to happen twice.
func (r *Registry[K]) sawEpoch(epoch int64) bool {
	for {
		old := r.epoch.Load()
		if epoch <= old {
			return false
		}
		if r.epoch.CompareAndSwap(old, epoch) {
			if old == 0 {
				return false // the first this process hears of: not a loss
			}
			r.lostAt.Store(time.Now().UnixNano())
			r.logSafely(slog.LevelWarn, "fleet: the store lost its data; held leases go back, and new admissions wait one renewal round",
				slog.String("registry", r.prefix), slog.Duration("pause", r.pause))
			return true
		}
	}
}

// lostData is called when a reply tells that the store lost its data: the
// heartbeat puts the held leases back at once, rather than at its next
// renewal, so that they are in long before the pause ends. (A renewal
// that meets the loss puts back its own batch; the leases of its earlier
// batches, renewed before the loss, go back with the next.)
func (r *Registry[K]) lostData() {
	select {
	case r.reassert <- struct{}{}:
	default:
	}
}

// pausedOutcome is the refusal of l's admission, waiting as w if not nil,
// while new admissions wait until the server time until, told by a reply
// at the server time now, with n leases on l's first key.
func (r *Registry[K]) pausedOutcome(l *lease[K], w *waiter, n, until, now int64) outcome {
	r.stats.paused.Add(1)
	// A reply cannot hold a caller for longer than a TTL (the script bounds
	// the pause so too): no value in the store, however far ahead, makes a
	// waiter sleep for long.
	retryIn := min(time.Duration(max(until-now, 0))*time.Millisecond, r.cfg.ttl)
	le := &slots.LimitError{Err: ErrPaused, Key: r.keyName(l.keys[0]), Cap: CapPaused, InFlight: int(n), Limit: l.limits[0],
		RetryAfter: max(retryIn, time.Millisecond)}
	// Not before the pause ends, and from then as a key at its limit
	// behind the callers told before: those refused during a pause come
	// back one after another, not together. The key's count now says
	// little of its room then (the live holders put their leases back
	// over the pause: the count is 0 at its start), so even the first is
	// told a turn of the key past the pause's end.
	//
	// A waiter's try is told nothing (it sleeps until the pause ends, or
	// a claim window, and tries again; see wait): booked, its return would
	// be booked again at each try, and push back the callers told after
	// it to the bound of the returns told (a waiter that times out in the
	// pause is told, and booked, then: see timedOut).
	if w == nil {
		le.RetryAfter = r.refusalRetryAfter(l, 0, le, int(n)-le.Limit, 0, retryIn, true)
	}
	return outcome{err: le, full: 0, retryIn: retryIn, paused: true, resume: time.Now().Add(retryIn), inFlight: int(n)}
}

// lostRecently reports whether this process found a data loss within the
// last TTL: its held leases are to go back within the pause, so failed
// renewals are made again without backing off.
func (r *Registry[K]) lostRecently() bool {
	at := r.lostAt.Load()
	return at != 0 && time.Since(time.Unix(0, at)) < r.cfg.ttl
}
