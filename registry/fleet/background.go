package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"
)

// releaseQueue bounds the releases waiting for the releaser; beyond it a
// release is sent on its own.
const releaseQueue = 4096

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

// recovered tells the heartbeat that an admission call closed the breaker:
// it puts the degraded leases back and wakes the waiters.
func (r *Registry[K]) recovered() {
	select {
	case r.recovery <- struct{}{}:
	default:
	}
}

// heartbeat renews the held leases every TTL/3 and, while the breaker is
// open, probes Redis to close it. It survives errors; if it ever stops
// before Close, it says so.
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
				r.retryAbandons()
			}
		case <-probe.C:
			if r.brk.open() && r.probe() {
				r.wakeAll()
			}
		case <-r.recovery:
			r.renew()
			r.retryAbandons() // those left while the breaker was open
			r.wakeAll()
		}
	}
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

// renew extends every held lease in Redis. A lease found missing is put
// back (WithLostLeases(ReassertLost), and always one admitted while Redis
// was unreachable) or only reported.
func (r *Registry[K]) renew() bool {
	var requeue []*lease[K]
	r.redisMu.Lock()
	r.mu.Lock()
	var held, degraded []*lease[K]
	for l := range r.leases {
		if l.degraded {
			degraded = append(degraded, l)
		} else {
			held = append(held, l)
		}
	}
	r.mu.Unlock()
	requeue, ok1 := r.renewBatch(held, r.cfg.lost == ReassertLost, requeue)
	requeue, ok2 := r.renewBatch(degraded, true, requeue)
	r.redisMu.Unlock()
	ok := ok1 && ok2
	// Queued after the unlock: the releaser takes redisMu.
	for _, l := range requeue {
		r.queueRelease(l)
	}
	return ok
}

// renewBatch renews leases in calls of up to batchSize pairs. It returns
// requeue with the leases whose removal must be sent (again), and whether
// every call worked.
func (r *Registry[K]) renewBatch(leases []*lease[K], reassert bool, requeue []*lease[K]) ([]*lease[K], bool) {
	ok := true
	for len(leases) > 0 {
		var keys []string
		var owner, batch []*lease[K]
		args := []any{r.cfg.ttl.Milliseconds(), 0}
		if reassert {
			args[1] = 1
		}
		for len(leases) > 0 && len(owner)+len(leases[0].names) <= max(batchSize, len(leases[0].names)) {
			l := leases[0]
			leases = leases[1:]
			batch = append(batch, l)
			for _, name := range l.names {
				keys = append(keys, name, r.tombstone(l.id))
				owner = append(owner, l)
				args = append(args, l.id)
			}
		}
		ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
		gone, err := renewScript.Run(ctx, r.rdb, keys, args...).Int64Slice()
		cancel()
		if err != nil {
			r.redisFailed(err)
			// The call may still run, and put leases back, later.
			requeue = append(requeue, r.afterFailedRenew(batch, reassert)...)
			ok = false
			continue
		}
		r.brk.ok()
		requeue = append(requeue, r.afterRenew(batch, owner, gone, reassert)...)
	}
	return requeue, ok
}

// afterRenew accounts for a renewal that worked: with reassert every lease
// of the batch is in Redis now (degraded ones stop being so), and those
// released meanwhile must be removed again. It returns those.
func (r *Registry[K]) afterRenew(batch, owner []*lease[K], gone []int64, reassert bool) []*lease[K] {
	var requeue []*lease[K]
	missing := map[*lease[K]]bool{}
	for _, i := range gone {
		missing[owner[i-1]] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range batch {
		_, live := r.leases[l]
		switch {
		case !live:
			if reassert {
				requeue = append(requeue, l)
			}
		case l.degraded:
			l.degraded, l.sent = false, false
			r.stats.reasserted.Add(1)
		case missing[l] && !l.reported:
			r.stats.lost.Add(1)
			if reassert {
				r.stats.reasserted.Add(1)
			} else {
				l.reported = true // once: it stays missing
			}
			if r.cfg.lost == CancelLost && l.cancel != nil {
				l.cancel(ErrLeaseLost) // does not block, takes no lock
			}
			r.cfg.log().Warn("fleet: lease missing in redis", slog.String("registry", r.prefix),
				slog.String("keys", fmt.Sprint(l.keys)), slog.Bool("reasserted", reassert))
		}
	}
	return requeue
}

// afterFailedRenew accounts for a renewal call that failed: with reassert
// it may put leases back, now or later (it may still be on its way). Its
// leases are marked so: released meanwhile or later, they are abandoned
// (removed, with a tombstone the renewal checks) rather than just removed.
// Those already released are returned for that.
func (r *Registry[K]) afterFailedRenew(batch []*lease[K], reassert bool) []*lease[K] {
	if !reassert {
		return nil
	}
	var requeue []*lease[K]
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range batch {
		if _, live := r.leases[l]; !live {
			requeue = append(requeue, l.abandonment())
		} else {
			l.sent = true
		}
	}
	return requeue
}

// queueRelease hands l's removal from Redis to the releaser. It blocks
// while the queue is full (Redis slower than the releases); after Close it
// drops l, whose lease then expires after the TTL. Call it with neither
// r.mu nor redisMu held.
func (r *Registry[K]) queueRelease(l *lease[K]) {
	select {
	case r.released <- l:
	case <-r.stopping.Done():
	}
}

// releaser removes released leases from Redis, a batch at a time. On Close
// it removes what is queued, then stops.
func (r *Registry[K]) releaser() {
	defer r.done.Done()
	for {
		select {
		case l := <-r.released:
			r.remove(r.drain(l))
		case <-r.stopping.Done():
			for r.brk.allow() { // Redis unreachable: the leases expire
				select {
				case l := <-r.released:
					r.remove(r.drain(l))
				default:
					return
				}
			}
			return
		}
	}
}

// drain returns first and the releases queued behind it, up to a batch.
func (r *Registry[K]) drain(first *lease[K]) []*lease[K] {
	batch := []*lease[K]{first}
	n := len(first.names)
	for n < batchSize {
		select {
		case l := <-r.released:
			batch = append(batch, l)
			n += len(l.names)
		default:
			return batch
		}
	}
	return batch
}

// remove deletes leases from Redis and publishes the wake-ups. A failure
// leaves them to expire after the lease TTL: they are no longer renewed.
func (r *Registry[K]) remove(leases []*lease[K]) {
	r.redisMu.Lock()
	defer r.redisMu.Unlock()
	var keys []string
	args := []any{r.channel}
	var abandons []*lease[K]
	for _, l := range leases {
		if l.abandoned {
			abandons = append(abandons, l)
			continue
		}
		for i, name := range l.names {
			keys = append(keys, name)
			args = append(args, l.id, l.limits[i])
		}
	}
	var failedAbandons []*lease[K]
	for chunk := range slices.Chunk(abandons, batchSize) {
		if !r.brk.allow() { // Redis unreachable: the heartbeat retries them
			failedAbandons = append(failedAbandons, chunk...)
			continue
		}
		failedAbandons = append(failedAbandons, r.abandonAll(chunk)...)
	}
	if len(failedAbandons) > 0 {
		// Retried by the heartbeat: the call they take back may have run.
		r.mu.Lock()
		r.retry = append(r.retry, failedAbandons...)
		r.mu.Unlock()
	}
	if len(keys) == 0 {
		return
	}
	// Each call its own deadline, not the stopping context: a release
	// during Close still reaches Redis.
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.opTimeout)
	defer cancel()
	if err := releaseScript.Run(ctx, r.rdb, keys, args...).Err(); err != nil {
		r.redisFailed(err)
	}
}

// abandonAll sends the abandons of leases in one pipeline, and returns
// those that failed.
func (r *Registry[K]) abandonAll(leases []*lease[K]) []*lease[K] {
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
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.opTimeout)
	defer cancel()
	cmds, perr := safeEvalAll(ctx, r.rdb, abandonScript, keys, args)
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

// retryAbandons sends again the abandons that failed, until they succeed
// or a lease TTL has passed (whatever they take back has expired by then).
func (r *Registry[K]) retryAbandons() {
	r.mu.Lock()
	var todo []*lease[K]
	now := time.Now()
	for _, l := range r.retry {
		if l.since.IsZero() {
			l.since = now
		}
		if now.Sub(l.since) < r.cfg.ttl {
			todo = append(todo, l)
		}
	}
	r.retry = nil
	r.mu.Unlock()
	if len(todo) > 0 {
		r.remove(todo)
	}
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
