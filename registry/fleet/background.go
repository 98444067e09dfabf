package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"
)

// maxRemovals bounds the removals from Redis waiting to be sent (a lease
// each, which its holder had in memory already); beyond it the oldest is
// dropped, and its lease expires in Redis after the TTL.
const maxRemovals = 1 << 16

// batchSize bounds the (key, lease) pairs of one renewal or release call.
const batchSize = 256

// breaker opens after threshold consecutive failed calls, so that while
// Redis is unreachable a decision costs no round trip; the heartbeat's
// probe closes it.
type breaker struct {
	threshold int32
	fails     atomic.Int32
	isOpen    atomic.Bool
}

func (b *breaker) allow() bool { return !b.isOpen.Load() }
func (b *breaker) open() bool  { return b.isOpen.Load() }

// failure counts a failed call and reports whether it opened the breaker.
func (b *breaker) failure() bool {
	return b.fails.Add(1) >= b.threshold && b.isOpen.CompareAndSwap(false, true)
}

// success counts a call that worked and reports whether it closed the
// breaker.
func (b *breaker) success() bool {
	b.fails.Store(0)
	return b.isOpen.CompareAndSwap(true, false)
}

// ok counts a call that worked without closing the breaker: only the probe
// closes it, after putting the degraded leases back.
func (b *breaker) ok() { b.fails.Store(0) }

// recovered is called when Redis answers again (a call closed the breaker)
// or degraded leases wait to go in: it wakes the heartbeat, which puts the
// degraded leases into Redis and wakes the waiters, and the releaser, which
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
// open, probes Redis to close it; with the breaker closed, it puts in
// degraded leases (admitted while one call failed) at the probe interval.
// It survives errors; if it ever stops before Close, it says so.
func (r *Registry[K]) heartbeat() {
	defer r.done.Done()
	defer func() {
		if p := recover(); p != nil {
			r.cfg.log().Error("fleet: heartbeat stopped; leases will expire", slog.String("registry", r.prefix), slog.Any("panic", p))
		}
	}()
	renew := time.NewTicker(r.cfg.ttl / 3)
	defer renew.Stop()
	probe := time.NewTicker(r.cfg.probeEvery)
	defer probe.Stop()
	for {
		select {
		case <-r.stopping.Done():
			return
		case <-renew.C:
			if r.brk.allow() {
				r.renew()
			}
		case <-probe.C:
			switch {
			case r.brk.open():
				if r.probe() {
					r.wakeAll()
				}
			case r.hasDegraded():
				r.renew()
			}
		case <-r.recovery:
			r.renew()
			r.wakeAll()
		}
	}
}

func (r *Registry[K]) hasDegraded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.degraded > 0
}

// probe pings Redis and, if it answers, puts back the leases taken while
// it was unreachable, then closes the breaker.
func (r *Registry[K]) probe() bool {
	ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
	err := r.rdb.Ping(ctx).Err()
	cancel()
	if err != nil {
		return false
	}
	if !r.renew() {
		return false // Redis answers pings but not scripts yet
	}
	if r.brk.success() {
		r.cfg.log().Info("fleet: redis reachable again; breaker closed", slog.String("registry", r.prefix))
	}
	// Leases admitted degraded since the renewal above go in at once.
	r.recovered()
	return true
}

// renewal is a lease as a renewal call sends it.
type renewal[K comparable] struct {
	l      *lease[K]
	mode   int   // renewOnly, reassert or putBack (see renewScript)
	epoch  int64 // l.epoch
	limits []int // l.limits
}

// renew extends every held lease in Redis. A lease found missing is put
// back or reported (see Lost); one admitted while Redis was unreachable is
// put back.
func (r *Registry[K]) renew() bool {
	r.redisMu.Lock()
	r.mu.Lock()
	batch := make([]renewal[K], 0, len(r.leases))
	for l := range r.leases {
		x := renewal[K]{l: l, mode: renewOnly, epoch: l.epoch, limits: slices.Clone(l.limits)}
		switch {
		case l.degraded:
			x.mode = putBack
		case r.cfg.lost == ReassertLost:
			x.mode = reassert
		}
		batch = append(batch, x)
	}
	r.mu.Unlock()
	requeue, ok := r.renewBatch(batch, nil)
	r.redisMu.Unlock()
	// Queued after the unlock: the releaser takes redisMu.
	for _, l := range requeue {
		r.queueRelease(l)
	}
	return ok
}

// renewBatch renews leases in calls of up to batchSize pairs. It returns
// requeue with the leases whose removal must be sent (again), and whether
// every call worked.
func (r *Registry[K]) renewBatch(leases []renewal[K], requeue []*lease[K]) ([]*lease[K], bool) {
	ok := true
	for len(leases) > 0 {
		keys := []string{r.epochKey}
		args := []any{r.cfg.ttl.Milliseconds()}
		var batch []renewal[K]
		pairs := 0
		for len(leases) > 0 && pairs+len(leases[0].l.names) <= max(batchSize, len(leases[0].l.names)) {
			x := leases[0]
			leases = leases[1:]
			batch = append(batch, x)
			pairs += len(x.l.names)
			keys = append(keys, x.l.names...)
			keys = append(keys, r.tombstone(x.l.id))
			args = append(args, x.l.id, x.mode, x.epoch, len(x.l.names))
			for _, n := range x.limits {
				args = append(args, n)
			}
		}
		ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
		res, err := renewScript.Run(ctx, r.rdb, keys, args...).Int64Slice()
		cancel()
		if err == nil && len(res) != 1+len(batch) {
			err = fmt.Errorf("fleet: unexpected renewal reply %v", res)
		}
		if err != nil {
			r.redisFailed(err)
			// The call may still run, and put leases back, later.
			requeue = append(requeue, r.afterFailedRenew(batch)...)
			ok = false
			continue
		}
		r.brk.ok()
		requeue = append(requeue, r.afterRenew(batch, res[0], res[1:])...)
	}
	return requeue, ok
}

// afterRenew accounts for a renewal that worked, under epoch, with each
// lease's status. A lease released meanwhile that the call put back must be
// removed again: it returns those.
func (r *Registry[K]) afterRenew(batch []renewal[K], epoch int64, status []int64) []*lease[K] {
	var requeue []*lease[K]
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, x := range batch {
		l, st := x.l, status[i]
		if _, live := r.leases[l]; !live {
			if st == leasePutBack || st == leaseRoom {
				requeue = append(requeue, l)
			}
			continue
		}
		switch {
		case st == leaseRenewed:
			if l.degraded { // an admission's call carried it in meanwhile
				r.stats.reasserted.Add(1)
			}
			r.inRedisLocked(l, epoch)
		case l.degraded:
			if st == leasePutBack {
				r.inRedisLocked(l, epoch)
				r.stats.reasserted.Add(1)
			}
		case st == leasePutBack || st == leaseRoom:
			if !l.reported {
				r.stats.lost.Add(1)
			}
			r.stats.reasserted.Add(1)
			r.inRedisLocked(l, epoch)
			why := "redis lost it"
			if st == leaseRoom {
				why = "expired; put back, there was room"
			}
			r.cfg.log().Warn("fleet: lease missing in redis, put back", slog.String("registry", r.prefix),
				slog.String("keys", fmt.Sprint(l.keys)), slog.String("why", why))
		default: // leaseGone
			l.epoch = 0
			if l.reported {
				break // once: it stays missing
			}
			l.reported = true
			r.stats.lost.Add(1)
			if r.cfg.lost != ReportLost && l.cancel != nil {
				l.cancel(ErrLeaseLost) // does not block, takes no lock
			}
			r.cfg.log().Warn("fleet: lease lost in redis", slog.String("registry", r.prefix),
				slog.String("keys", fmt.Sprint(l.keys)), slog.Bool("reassert", x.mode == reassert))
		}
	}
	return requeue
}

// afterFailedRenew accounts for a renewal call that failed: it may put
// leases back, now or later (it may still be on its way). Those it may put
// back are marked so: released meanwhile or later, they are abandoned
// (removed, with a tombstone the renewal checks) rather than just removed.
// Those already released are returned for that.
func (r *Registry[K]) afterFailedRenew(batch []renewal[K]) []*lease[K] {
	var requeue []*lease[K]
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range batch {
		if x.mode == renewOnly {
			continue
		}
		if _, live := r.leases[x.l]; !live {
			requeue = append(requeue, x.l.abandonment())
		} else {
			x.l.sent = true
		}
	}
	return requeue
}

// queueRelease hands l's removal from Redis to the releaser. It never
// waits: past maxRemovals pending, the oldest is dropped (its lease expires
// after the TTL); after Close l is dropped. Call it with neither r.mu nor
// redisMu held.
func (r *Registry[K]) queueRelease(l *lease[K]) {
	if r.stopping.Err() != nil {
		return
	}
	now := time.Now()
	r.remMu.Lock()
	if l.since.IsZero() {
		l.since = now
	}
	r.removals = append(r.removals, l)
	r.dropOverLocked()
	r.remMu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// dropOverLocked drops the oldest removals past the bound.
func (r *Registry[K]) dropOverLocked() {
	for len(r.removals) > r.maxPending {
		r.removals[0] = nil
		r.removals = r.removals[1:]
		r.stats.removalsDropped.Add(1)
	}
}

// nextRemovals takes the oldest pending removals, up to a batch of pairs.
// Those queued a lease TTL ago or more are dropped: their leases have
// expired by now (a lease is not renewed once released).
func (r *Registry[K]) nextRemovals() []*lease[K] {
	now := time.Now()
	r.remMu.Lock()
	defer r.remMu.Unlock()
	var batch []*lease[K]
	pairs, i := 0, 0
	for ; i < len(r.removals) && pairs < batchSize; i++ {
		l := r.removals[i]
		r.removals[i] = nil
		if now.Sub(l.since) >= r.cfg.ttl {
			r.stats.removalsDropped.Add(1)
			continue
		}
		batch = append(batch, l)
		pairs += len(l.names)
	}
	r.removals = r.removals[i:]
	if len(r.removals) == 0 {
		r.removals = nil // let the array go
	}
	return batch
}

// putBackRemovals returns removals that failed to the front of the queue.
func (r *Registry[K]) putBackRemovals(failed []*lease[K]) {
	r.remMu.Lock()
	defer r.remMu.Unlock()
	r.removals = append(slices.Clip(failed), r.removals...)
	r.dropOverLocked()
}

// releaser removes released leases (and abandoned calls' lease ids) from
// Redis, a batch at a time. A removal that fails, or that waits while the
// breaker is open, is sent again, with backoff (WithPoll's: from its
// minimum, doubling to its maximum) or as soon as the breaker closes, until
// it succeeds or its lease has expired. On Close it sends what is queued,
// within one call timeout, then stops.
func (r *Registry[K]) releaser() {
	defer r.done.Done()
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	var backoff time.Duration
	for {
		if backoff == 0 {
			select {
			case <-r.kick:
			case <-r.stopping.Done():
				r.flushRemovals()
				return
			}
		} else {
			wait.Reset(jitter(backoff))
			select {
			case <-wait.C:
			case <-r.resume:
				wait.Stop()
			case <-r.stopping.Done():
				wait.Stop()
				r.flushRemovals()
				return
			}
		}
		if r.sendRemovals(context.Background()) {
			backoff = 0
		} else {
			backoff = min(max(2*backoff, r.cfg.pollMin), r.cfg.pollMax)
		}
	}
}

// sendRemovals sends the pending removals until none are left (true), or
// until one fails or the breaker is open (false): those wait in the queue.
func (r *Registry[K]) sendRemovals(ctx context.Context) bool {
	for ctx.Err() == nil {
		batch := r.nextRemovals()
		if batch == nil {
			return true
		}
		if !r.brk.allow() {
			r.putBackRemovals(batch)
			return false
		}
		if failed := r.remove(ctx, batch); len(failed) > 0 {
			r.putBackRemovals(failed)
			return false
		}
	}
	return false
}

// flushRemovals sends what is queued at Close, within one call timeout in
// all: Redis unreachable or slow, the leases expire.
func (r *Registry[K]) flushRemovals() {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.opTimeout)
	defer cancel()
	r.sendRemovals(ctx)
}

// remove deletes leases from Redis and publishes the wake-ups, each call
// within the call timeout (and ctx). It returns those it could not remove.
func (r *Registry[K]) remove(ctx context.Context, leases []*lease[K]) (failed []*lease[K]) {
	r.redisMu.Lock()
	defer r.redisMu.Unlock()
	var keys []string
	args := []any{r.channel}
	var abandons, plain []*lease[K]
	for _, l := range leases {
		if l.abandoned {
			abandons = append(abandons, l)
			continue
		}
		plain = append(plain, l)
		for i, name := range l.names {
			keys = append(keys, name)
			args = append(args, l.id, l.limits[i])
		}
	}
	for chunk := range slices.Chunk(abandons, batchSize) {
		if !r.brk.allow() { // Redis unreachable: sent again later
			failed = append(failed, chunk...)
			continue
		}
		failed = append(failed, r.abandonAll(ctx, chunk)...)
	}
	if len(keys) == 0 {
		return failed
	}
	// Each call its own deadline, not the stopping context: a release
	// during Close still reaches Redis.
	cctx, cancel := context.WithTimeout(ctx, r.cfg.opTimeout)
	defer cancel()
	if err := releaseScript.Run(cctx, r.rdb, keys, args...).Err(); err != nil {
		r.redisFailed(err)
		failed = append(failed, plain...)
	}
	return failed
}

// abandonAll sends the abandons of leases in one pipeline, and returns
// those that failed.
func (r *Registry[K]) abandonAll(ctx context.Context, leases []*lease[K]) []*lease[K] {
	keys, args := make([][]string, len(leases)), make([][]any, len(leases))
	for i, l := range leases {
		keys[i] = append(slices.Clip(l.names), r.tombstone(l.id))
		args[i] = []any{l.id, r.cfg.ttl.Milliseconds(), r.channel}
		if len(l.limits) == len(l.names) { // the wake-ups need them
			for _, n := range l.limits {
				args[i] = append(args[i], n)
			}
		}
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.opTimeout)
	defer cancel()
	cmds, perr := safeEvalAll(cctx, r.rdb, abandonScript, keys, args)
	if perr != nil {
		r.redisFailed(perr)
		return leases
	}
	var failed []*lease[K]
	var failure error
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			failure = err
			failed = append(failed, leases[i])
		}
	}
	if failure != nil {
		r.redisFailed(failure) // once for the pipeline
	}
	return failed
}

// subscribe listens for releases anywhere in the fleet and wakes a waiter
// held up by the key released.
func (r *Registry[K]) subscribe() {
	defer r.done.Done()
	ps := r.rdb.Subscribe(r.stopping, r.channel)
	defer ps.Close()
	if _, err := ps.Receive(r.stopping); err == nil {
		close(r.subscribed) // confirmed; if not, the client resubscribes later
	}
	ch := ps.Channel()
	for {
		select {
		case <-r.stopping.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			r.wokenBy(m.Payload)
		}
	}
}
