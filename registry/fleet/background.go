package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// batchSize bounds the (key, lease) pairs of one renewal or release call.
const batchSize = 256

// cutBatch returns the first of items whose pairs (pairs of each) come to
// at most batchSize, at least one (a lease of more keys goes alone), and
// the rest.
func cutBatch[T any](items []T, pairs func(T) int) (batch, rest []T) {
	n, i := 0, 0
	for ; i < len(items) && (i == 0 || n+pairs(items[i]) <= batchSize); i++ {
		n += pairs(items[i])
	}
	return items[:i:i], items[i:]
}

// breaker opens after threshold consecutive failed calls, so that while
// the store is unreachable a decision costs no round trip; the heartbeat's
// probe closes it.
type breaker struct {
	threshold int32
	fails     atomic.Int32
	isOpen    atomic.Bool
	outage
}

func (b *breaker) allow() bool { return !b.isOpen.Load() }

func (b *breaker) open() bool { return b.isOpen.Load() }

// failure counts a failed call and reports whether it opened the breaker.
func (b *breaker) failure() bool {
	b.failed()
	return b.fails.Add(1) >= b.threshold && b.isOpen.CompareAndSwap(false, true)
}

// success counts a call that worked and reports whether it closed the
// breaker.
func (b *breaker) success() bool {
	b.ok()
	return b.isOpen.CompareAndSwap(true, false)
}

// ok counts a call that worked without closing the breaker: only the probe
// closes it, after putting the degraded leases back.
func (b *breaker) ok() {
	b.fails.Store(0)
	b.answered()
}

// recovered is called when the store answers again (a call closed the breaker)
// or degraded leases wait to go in: it wakes the heartbeat, which puts the
// degraded leases into the store and wakes the waiters, and the releaser, which
// sends the removals it kept.
func (r *Registry[K]) recovered() {
	select {
	case r.recovery <- struct{}{}:
	default:
	}
	select {
	case r.resume <- struct{}{}:
	default:
	}
}

// heartbeat renews the held leases every TTL/3 and, while the breaker is
// open, probes the store to close it (at the probe interval, and at each
// renewal's time too); with the breaker closed, it puts in degraded leases
// (admitted while one call failed) at the probe interval, and every held
// lease at once when an admission's reply tells that the store lost its
// data. A renewal that failed is made again at the next probe tick, not a
// whole TTL/3 later, and while it keeps failing at longer gaps
// (retryTicks). After the store lost its data the held leases must go back
// within the renewal round that new admissions wait for (see pause.go): a
// long probe interval, or a first call after a restart that fails, must not
// put them off to the next round. It survives errors, and panics (a client
// hook's, a log handler's): one tick's panic is logged and the next tick
// comes as usual.
func (r *Registry[K]) heartbeat() {
	defer r.done.Done()
	renew := time.NewTicker(r.cfg.ttl / 3)
	defer renew.Stop()
	probe := time.NewTicker(r.cfg.probeEvery)
	defer probe.Stop()
	// retry spaces the renewals made again after a failed one.
	retry := retryTicks{max: max(1, int((r.cfg.ttl/3)/r.cfg.probeEvery))}
	renewNow := func() {
		ok := r.renew()
		if !ok && r.lostRecently() {
			// The held leases must be back before the pause ends: no
			// backing off within a TTL of a loss.
			retry.soon()
			return
		}
		retry.after(ok)
	}
	for {
		select {
		case <-r.stopping.Done():
			return
		case <-renew.C:
			r.survive("renewal", func() {
				if r.brk.allow() {
					renewNow()
				} else if r.probe() {
					r.wakeAll()
				}
			})
		case <-r.reassert:
			r.survive("renewal", func() {
				if r.brk.allow() {
					renewNow()
				}
			})
		case <-probe.C:
			r.survive("probe", func() {
				switch {
				case r.brk.open():
					retry.after(true) // the probe renews, once the store answers
					if r.probe() {
						r.wakeAll()
					}
				case r.hasDegraded() || retry.due():
					renewNow()
				}
			})
		case <-r.recovery:
			r.survive("renewal", func() {
				renewNow()
				r.wakeAll()
			})
		}
	}
}

// retryTicks spaces the renewals a failed one makes again, in probe ticks:
// the first at the next tick, each next one after twice as many, up to max
// (a renewal round). A renewal fails if any of its calls does, so while
// some calls keep failing (an overloaded store, one bad batch) the breaker
// may stay closed; retrying all leases every tick would multiply the load
// by up to a round's ticks. Its methods run on the heartbeat's goroutine.
type retryTicks struct {
	failed bool
	gap    int // ticks between tries now
	wait   int // ticks left before the next
	max    int
}

// after notes how the latest renewal went.
func (t *retryTicks) after(ok bool) {
	if ok {
		t.failed, t.gap, t.wait = false, 0, 0
		return
	}
	t.gap = min(max(2*t.gap, 1), t.max)
	t.failed, t.wait = true, t.gap
}

// soon makes a failed renewal again at the next tick, whatever the gap.
func (t *retryTicks) soon() { t.failed, t.wait = true, 1 }

// due counts a probe tick and reports whether a failed renewal is to be
// made again at it.
func (t *retryTicks) due() bool {
	if !t.failed {
		return false
	}
	t.wait--
	return t.wait <= 0
}

// panicLogEvery is how often at most a background goroutine logs a panic
// it survived.
const panicLogEvery = time.Minute

// survive runs f, one step of a background goroutine (what names it), and
// logs a panic in it rather than let it end the goroutine, or the process:
// at most once a panicLogEvery, with the count so far.
func (r *Registry[K]) survive(what string, f func()) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		n := r.panics.Add(1)
		now := time.Now().UnixNano()
		last := r.panicLogged.Load()
		if last != 0 && now-last < int64(panicLogEvery) || !r.panicLogged.CompareAndSwap(last, now) {
			return
		}
		defer func() { _ = recover() }() // the logger may be what panics
		r.cfg.log().Error("fleet: panic in the background, survived", slog.String("registry", r.prefix),
			slog.String("in", what), slog.Any("panic", p), slog.Uint64("panics", n))
	}()
	f()
}

// logSafely logs, surviving a log handler that panics: the fleet logs in
// the middle of its bookkeeping (a batch of removals taken off its queue, a
// breaker just opened), which a panic must not cut short.
func (r *Registry[K]) logSafely(level slog.Level, msg string, attrs ...slog.Attr) {
	defer func() { _ = recover() }()
	r.cfg.log().LogAttrs(context.Background(), level, msg, attrs...)
}

func (r *Registry[K]) hasDegraded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.held.degraded) > 0
}

// probe pings the store and, if it answers, puts back the leases taken while
// it was unreachable, then closes the breaker.
func (r *Registry[K]) probe() bool {
	ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
	err := r.store.Ping(ctx)
	cancel()
	if err != nil {
		if r.stopping.Err() == nil {
			r.brk.failed() // the outage goes on, should a late answer have ended it
		}
		return false
	}
	if !r.renew() {
		return false // the store answers pings but not scripts yet
	}
	if r.brk.success() {
		r.logSafely(slog.LevelInfo, "fleet: store reachable again; breaker closed", slog.String("registry", r.prefix))
	}
	// Leases admitted degraded since the renewal above go in at once.
	r.recovered()
	return true
}

// renewal is a lease as a renewal call sends it.
type renewal[K comparable] struct {
	l      *lease[K]
	mode   driver.Mode // see RenewCall
	epoch  int64       // l.epoch
	limits []int       // l.limits
}

// renew extends every held lease in the store. A lease found missing is put
// back or reported (see Lost); one admitted while the store was unreachable is
// put back. It reports whether every call worked.
func (r *Registry[K]) renew() bool {
	var requeue []*lease[K]
	// Queued once storeMu is unlocked (the releaser takes it), even if a
	// renewal panics.
	defer func() { r.queueReleases(requeue) }()
	r.storeMu.Lock()
	defer r.storeMu.Unlock()
	r.mu.Lock()
	batch := make([]renewal[K], 0, len(r.held.leases))
	for l := range r.held.leases {
		x := renewal[K]{l: l, mode: driver.ModeReport, epoch: l.epoch, limits: slices.Clone(l.limits)}
		switch {
		case l.degraded:
			x.mode = driver.ModePutBack
		case r.cfg.lost == ReassertLost:
			x.mode = driver.ModeReassert
		}
		batch = append(batch, x)
	}
	r.mu.Unlock()
	return r.renewBatch(batch, &requeue)
}

// renewBatch renews leases in calls of up to batchSize pairs, and adds to
// requeue the leases whose removal must be sent (again). It reports whether
// every call worked; once a call has failed and the breaker is open, it
// sends no more. With no lease it makes one call all the same: a process
// that holds nothing is heard by the store each renewal round too, so that
// a store that hears nobody for half a TTL knows that no live holder could
// reach it (see driver.Store). Call it with storeMu held.
func (r *Registry[K]) renewBatch(leases []renewal[K], requeue *[]*lease[K]) bool {
	ok := true
	for first := true; first || len(leases) > 0; first = false {
		// The not-after time goes in at each try.
		call := &driver.RenewCall{TTL: r.cfg.ttl, Epoch: r.epoch.Load(), Pause: r.pause}
		var batch []renewal[K]
		batch, leases = cutBatch(leases, func(x renewal[K]) int { return len(x.l.names) })
		for _, x := range batch {
			call.Leases = append(call.Leases, driver.Renewal{Lease: x.l.id, Units: x.l.units, Mode: x.mode, Epoch: x.epoch, Keys: x.l.names, Limits: x.limits})
		}
		res, until, err := r.renewCall(call)
		if err == nil && len(res.Leases) != len(batch) {
			err = fmt.Errorf("fleet: %d fates in a renewal of %d leases", len(res.Leases), len(batch))
		}
		if err != nil {
			r.storeFailed(err)
			// The call may still run, and put leases back, later.
			*requeue = append(*requeue, r.afterFailedRenew(batch, until)...)
			if r.brk.open() {
				return false // the store is unreachable: the rest waits for the probe
			}
			ok = false
			continue
		}
		r.brk.ok()
		if r.sawEpoch(res.Epoch) {
			// Leases of this renewal's earlier calls, renewed before the
			// loss, are missing now: once more, right after.
			r.lostData()
		}
		again, lost := r.afterRenew(batch, res.Epoch, res.Leases)
		*requeue = append(*requeue, again...)
		r.reportMissing(lost)
	}
	return ok
}

// renewCall makes the renewal call, and returns its result and the
// not-after time of the call, which may still run if it failed. A call
// refused as late (see attempt) is made once more.
func (r *Registry[K]) renewCall(call *driver.RenewCall) (res driver.RenewResult, until int64, err error) {
	for try := 0; ; try++ {
		until = r.clock.notAfter(r.lateSpan())
		call.NotAfter = scriptUntil(until)
		ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
		sent := r.clock.local()
		res, err = safeStore(func() (driver.RenewResult, error) { return r.store.Renew(ctx, call) })
		cancel()
		if err != nil {
			return res, until, err
		}
		r.clock.seen(res.Now, sent, r.clock.local())
		if !res.TooLate {
			return res, until, nil
		}
		if try > 0 {
			return driver.RenewResult{}, until, errors.New("fleet: renewal refused as late twice")
		}
	}
}

// missing is a held lease that a renewal found missing in the store: put back
// (why says why), or lost (why is empty).
type missing[K comparable] struct {
	l      *lease[K]
	why    string
	mode   driver.Mode
	cancel context.CancelCauseFunc // with CancelLost or ReassertLost: cancel its holder
}

// afterRenew accounts for a renewal that worked, under epoch, with each
// lease's status. It returns the leases released meanwhile that the call put
// back, to be removed again, and the held leases found missing, to be
// reported once r.mu is unlocked.
func (r *Registry[K]) afterRenew(batch []renewal[K], epoch int64, status []driver.Fate) (requeue []*lease[K], found []missing[K]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, x := range batch {
		l, st := x.l, status[i]
		if _, live := r.held.leases[l]; !live {
			if st == driver.FatePutBack || st == driver.FateRoom {
				requeue = append(requeue, l)
			}
			continue
		}
		switch {
		case st == driver.FateRenewed:
			if l.degraded { // an admission's call carried it in meanwhile
				r.stats.reasserted.Add(1)
			}
			r.inStoreLocked(l, epoch)
		case l.degraded:
			if st == driver.FatePutBack {
				r.inStoreLocked(l, epoch)
				r.stats.reasserted.Add(1)
			}
		case st == driver.FatePutBack || st == driver.FateRoom:
			if !l.reported {
				r.stats.lost.Add(1)
			}
			r.stats.reasserted.Add(1)
			r.inStoreLocked(l, epoch)
			why := "the store lost it"
			if st == driver.FateRoom {
				why = "expired; put back, there was room"
			}
			found = append(found, missing[K]{l: l, why: why})
		default: // FateGone
			l.epoch = 0
			if l.reported {
				break // once: it stays missing
			}
			l.reported = true
			r.stats.lost.Add(1)
			m := missing[K]{l: l, mode: x.mode}
			if r.cfg.lost != ReportLost {
				m.cancel = l.cancel
			}
			found = append(found, m)
		}
	}
	return requeue, found
}

// reportMissing cancels the holders of the leases lost in found, then logs
// every lease of found. Call it with no lock held: a log handler may block,
// or panic.
func (r *Registry[K]) reportMissing(found []missing[K]) {
	for _, m := range found {
		if m.cancel != nil {
			m.cancel(ErrLeaseLost)
		}
	}
	for _, m := range found {
		if m.why != "" {
			r.logSafely(slog.LevelWarn, "fleet: lease missing in the store, put back", slog.String("registry", r.prefix),
				slog.String("keys", fmt.Sprint(m.l.keys)), slog.String("why", m.why))
			continue
		}
		r.logSafely(slog.LevelWarn, "fleet: lease lost in the store", slog.String("registry", r.prefix),
			slog.String("keys", fmt.Sprint(m.l.keys)), slog.Bool("reassert", m.mode == driver.ModeReassert))
	}
}

// afterFailedRenew accounts for a renewal call that failed, with the
// not-after time until: it may put leases back, now or later (it may still
// be on its way). Those it may put back are marked so: released meanwhile
// or later, they are abandoned (removed, with a tombstone the renewal
// checks) rather than just removed. Those already released are returned
// for that.
func (r *Registry[K]) afterFailedRenew(batch []renewal[K], until int64) []*lease[K] {
	var requeue []*lease[K]
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range batch {
		if x.mode == driver.ModeReport {
			continue
		}
		x.l.until = max(x.l.until, until)
		if _, live := r.held.leases[x.l]; !live {
			requeue = append(requeue, x.l.abandonment())
		} else {
			x.l.sent = true
		}
	}
	return requeue
}

// subscribe listens, until Close, for the grants of this process's
// waiters queued in the store and for the learned states published. Each
// time the store listens, the first time too, every waiter asks again (a
// grant may have been made before) and every learned state is read again.
func (r *Registry[K]) subscribe() {
	defer r.done.Done()
	r.store.Listen(r.stopping, r.proc, listener[K]{r})
}

// listener is a Registry as a Listener.
type listener[K comparable] struct{ r *Registry[K] }

func (l listener[K]) Listening() {
	select {
	case <-l.r.subscribed:
	default:
		close(l.r.subscribed)
	}
	// What was published while the store did not listen (before its first
	// subscription too) was missed: a waiter's grant, whose claim window
	// may end before the waiter's next ask, and learned states.
	l.r.wakeAll()
	l.r.learnedStale()
}

func (l listener[K]) Granted(ticket string) { l.r.granted(ticket) }

func (l listener[K]) Learned(state string) {
	l.r.survive("learned message", func() { l.r.learnedMessage(state) })
}
