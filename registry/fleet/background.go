package fleet

import (
	"context"
	"fmt"
	"log/slog"
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
			}
		case <-probe.C:
			if r.brk.open() && r.probe() {
				r.renew() // puts back the leases taken meanwhile
				r.wakeAll()
			}
		}
	}
}

// probe pings Redis and closes the breaker if it answers.
func (r *Registry[K]) probe() bool {
	ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
	defer cancel()
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		return false
	}
	if r.brk.success() {
		r.cfg.log().Info("fleet: redis reachable again; breaker closed", slog.String("registry", r.prefix))
	}
	return true
}

// renew extends every held lease in Redis. A lease found missing is put
// back (WithLostLeases(ReassertLost), and always one admitted while Redis
// was unavailable) or only reported.
func (r *Registry[K]) renew() {
	r.redisMu.Lock()
	defer r.redisMu.Unlock()
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
	r.renewBatch(held, r.cfg.lost == ReassertLost)
	r.renewBatch(degraded, true)
}

func (r *Registry[K]) renewBatch(leases []*lease[K], reassert bool) {
	for len(leases) > 0 {
		var keys []string
		var owner []*lease[K]
		args := []any{r.cfg.ttl.Milliseconds(), 0}
		if reassert {
			args[1] = 1
		}
		for len(leases) > 0 && len(keys)+len(leases[0].names) <= max(batchSize, len(leases[0].names)) {
			l := leases[0]
			leases = leases[1:]
			for _, name := range l.names {
				keys = append(keys, name)
				owner = append(owner, l)
				args = append(args, l.id)
			}
		}
		ctx, cancel := context.WithTimeout(r.stopping, r.cfg.opTimeout)
		gone, err := renewScript.Run(ctx, r.rdb, keys, args...).Int64Slice()
		cancel()
		if err != nil {
			r.redisFailed(err)
			return
		}
		r.brk.success()
		r.afterRenew(owner, gone, reassert)
	}
}

// afterRenew accounts for the leases a renewal found gone.
func (r *Registry[K]) afterRenew(owner []*lease[K], gone []int64, reassert bool) {
	seen := map[*lease[K]]bool{}
	for _, i := range gone {
		l := owner[i-1]
		if seen[l] {
			continue
		}
		seen[l] = true
		r.mu.Lock()
		_, live := r.leases[l]
		wasDegraded := l.degraded
		if live {
			l.degraded = false
		}
		r.mu.Unlock()
		switch {
		case !live:
			// Released while this renewal ran: its release, queued or
			// skipped, may not remove what was just put back.
			if reassert {
				r.queueRelease(l)
			}
		case wasDegraded:
			r.stats.reasserted.Add(1)
		default:
			r.stats.lost.Add(1)
			if reassert {
				r.stats.reasserted.Add(1)
			}
			r.cfg.log().Warn("fleet: lease missing in redis", slog.String("registry", r.prefix),
				slog.String("keys", fmt.Sprint(l.keys)), slog.Bool("reasserted", reassert))
		}
	}
}

// queueRelease hands l's removal from Redis to the releaser.
func (r *Registry[K]) queueRelease(l *lease[K]) {
	select {
	case r.released <- l:
	default: // a full queue: this one goes on its own
		go r.remove([]*lease[K]{l})
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
			for {
				select {
				case l := <-r.released:
					r.remove(r.drain(l))
				default:
					return
				}
			}
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
	for _, l := range leases {
		for i, name := range l.names {
			keys = append(keys, name)
			args = append(args, l.id, l.limits[i])
		}
	}
	// Its own deadline, not the stopping context: a release during Close
	// still reaches Redis.
	ctx, cancel := context.WithTimeout(context.Background(), 4*r.cfg.opTimeout)
	defer cancel()
	if err := releaseScript.Run(ctx, r.rdb, keys, args...).Err(); err != nil {
		r.redisFailed(err)
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
