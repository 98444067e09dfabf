package fleet

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// maxRemovals bounds the removals from the store waiting to be sent (a lease
// each, which its holder had in memory already); beyond it the oldest is
// dropped, and its lease expires in the store after the TTL.
const maxRemovals = 1 << 16

// queueRelease hands l's removal from the store to the releaser. It never
// waits while the Registry runs: past maxRemovals pending, the oldest that
// may go is dropped (see droppable). Once Close has stopped the releaser
// (or as it sends what is queued), l is removed now (see removeAfterStop):
// a removal queued then would never be sent (a renewal that Close cut after
// it put back a lease released meanwhile, an admission whose caller left as
// Close came, a Release that began before Close). Call it with neither r.mu
// nor storeMu held.
func (r *Registry[K]) queueRelease(l *lease[K]) {
	r.queueReleases([]*lease[K]{l})
}

// queueReleases is queueRelease of several leases: once the releaser has
// stopped, they are removed together, within one call timeout in all.
func (r *Registry[K]) queueReleases(ls []*lease[K]) {
	if len(ls) == 0 {
		return
	}
	now := time.Now()
	r.remMu.Lock()
	// Under remMu: the releaser's last sending, which follows the stop,
	// takes what was queued before it.
	if r.stopping.Err() != nil {
		r.remMu.Unlock()
		r.removeAfterStop(ls)
		return
	}
	for _, l := range ls {
		if l.since.IsZero() {
			l.since = now
		}
	}
	r.removals = append(r.removals, ls...)
	r.dropOverLocked()
	r.remMu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// removeAfterStop removes leases from the store once the releaser has
// stopped: at once, in one go, within one call timeout in all (the wait for
// storeMu included, which other removals after the stop may hold), and not
// while the breaker is open, as the releaser's flush would not. What it
// cannot send is dropped: those leases expire after the TTL.
func (r *Registry[K]) removeAfterStop(ls []*lease[K]) {
	if !r.brk.allow() {
		r.stats.removalsDropped.Add(uint64(len(ls)))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.opTimeout)
	defer cancel()
	if !r.storeMu.lockCtx(ctx) {
		r.stats.removalsDropped.Add(uint64(len(ls)))
		return
	}
	defer r.storeMu.Unlock()
	if failed := r.removeLocked(ctx, ls); len(failed) > 0 {
		r.stats.removalsDropped.Add(uint64(len(failed)))
	}
}

// droppable reports whether the removal l may be given up: a released
// lease's may (it expires after the TTL, as it is not renewed), but an
// abandon's only once no call that may add its lease id can run any more
// (see clock.go): a call still on its way would add a lease nobody holds,
// for a whole TTL. Over the bound of pending removals, an abandon of calls
// made before the server's clock was known (unknownUntil) may go too: they
// are never given up otherwise, and would have no bound.
func (r *Registry[K]) droppable(l *lease[K], overBound bool) bool {
	return !l.abandoned || r.clock.past(l.until) || overBound && l.until == unknownUntil
}

// dropOverLocked drops the oldest removals past the bound that may be
// given up.
func (r *Registry[K]) dropOverLocked() {
	for i := 0; len(r.removals) > r.maxPending && i < len(r.removals); {
		if !r.droppable(r.removals[i], true) {
			i++
			continue
		}
		if i == 0 {
			r.removals[0] = nil
			r.removals = r.removals[1:]
		} else {
			r.removals = slices.Delete(r.removals, i, i+1)
		}
		r.stats.removalsDropped.Add(1)
	}
}

// nextRemovals takes the oldest pending removals, up to a batch of pairs
// (a lease's all in one, as cutBatch takes them).
// Those queued a lease TTL ago or more are dropped if they may be (see
// droppable): their leases have expired by now.
func (r *Registry[K]) nextRemovals() []*lease[K] {
	now := time.Now()
	r.remMu.Lock()
	defer r.remMu.Unlock()
	var batch []*lease[K]
	pairs, i := 0, 0
	for ; i < len(r.removals); i++ {
		l := r.removals[i]
		if now.Sub(l.since) >= r.cfg.ttl && r.droppable(l, false) {
			r.removals[i] = nil
			r.stats.removalsDropped.Add(1)
			continue
		}
		if len(batch) > 0 && pairs+len(l.names) > batchSize { // as cutBatch cuts
			break
		}
		r.removals[i] = nil
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
// the store, a batch at a time. A removal that fails (or panics, in a client
// hook), or that waits while the breaker is open, is sent again, with
// backoff (WithPoll's: from its minimum, doubling to its maximum) or as soon
// as the breaker closes, until it succeeds or it may be given up (see
// droppable). On Close it sends what is queued, within one call timeout,
// then stops.
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
		sent := false
		r.survive("removal", func() { sent = r.sendRemovals(context.Background()) })
		if sent {
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
// all: the store unreachable or slow, the leases expire.
func (r *Registry[K]) flushRemovals() {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.opTimeout)
	defer cancel()
	r.survive("removal", func() { r.sendRemovals(ctx) })
	// What is left is given up (nothing queues after the stop: see
	// queueReleases), and counted so, as removeAfterStop counts its own.
	r.remMu.Lock()
	r.stats.removalsDropped.Add(uint64(len(r.removals)))
	r.removals = nil
	r.remMu.Unlock()
}

// remove deletes leases from the store and serves their keys' queues, each call
// within the call timeout (and ctx). It returns those it could not remove.
func (r *Registry[K]) remove(ctx context.Context, leases []*lease[K]) (failed []*lease[K]) {
	r.storeMu.Lock()
	defer r.storeMu.Unlock()
	return r.removeLocked(ctx, leases)
}

// removeLocked is remove with storeMu held.
func (r *Registry[K]) removeLocked(ctx context.Context, leases []*lease[K]) (failed []*lease[K]) {
	var abandons, plain []*lease[K]
	for _, l := range leases {
		if l.abandoned {
			abandons = append(abandons, l)
			continue
		}
		plain = append(plain, l)
	}
	// The releases go first: they free places, and each abandon may be a
	// call of its own. Calls of up to batchSize pairs (a lease's all in
	// one): removeAfterStop may be handed more.
	for first := true; len(plain) > 0; first = false {
		call := &driver.ReleaseCall{TTL: r.cfg.ttl, Pause: r.pause, Claim: r.claim}
		var chunk []*lease[K]
		chunk, plain = cutBatch(plain, func(l *lease[K]) int { return len(l.names) })
		for _, l := range chunk {
			for i, name := range l.names {
				call.Pairs = append(call.Pairs, driver.Release{Key: name, Lease: l.id, Limit: l.limits[i]})
			}
		}
		if !first && !r.brk.allow() { // the store unreachable: sent again later
			failed = append(failed, chunk...)
			continue
		}
		failed = append(failed, r.release(ctx, call, chunk)...)
	}
	for chunk := range slices.Chunk(abandons, batchSize) {
		if !r.brk.allow() { // the store unreachable: sent again later
			failed = append(failed, chunk...)
			continue
		}
		failed = append(failed, r.abandonAll(ctx, chunk)...)
	}
	return failed
}

// release sends call, the removals of leases, and returns leases if it
// failed.
func (r *Registry[K]) release(ctx context.Context, call *driver.ReleaseCall, leases []*lease[K]) []*lease[K] {
	// Its own deadline, not the stopping context: a release during Close
	// still reaches the store.
	cctx, cancel := context.WithTimeout(ctx, r.cfg.opTimeout)
	defer cancel()
	if _, err := safeStore(func() (struct{}, error) { return struct{}{}, r.store.Release(cctx, call) }); err != nil {
		r.storeFailed(err)
		return leases
	}
	return nil
}

// abandonAll sends the abandons of leases in one call, and returns those
// that failed.
func (r *Registry[K]) abandonAll(ctx context.Context, leases []*lease[K]) []*lease[K] {
	calls := make([]*driver.AbandonCall, len(leases))
	for i, l := range leases {
		calls[i] = &driver.AbandonCall{Lease: l.id, Keys: l.names, TTL: r.cfg.ttl, NotAfter: scriptUntil(l.until), Pause: r.pause, Claim: r.claim}
		if len(l.limits) == len(l.names) { // serving the queues needs them
			calls[i].Limits = l.limits
		}
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.opTimeout)
	defer cancel()
	errs, perr := safeStore(func() ([]error, error) { return r.store.Abandon(cctx, calls) })
	if perr == nil && len(errs) != len(calls) {
		perr = fmt.Errorf("fleet: %d results for %d abandons", len(errs), len(calls))
	}
	if perr != nil {
		r.storeFailed(perr)
		return leases
	}
	var failed []*lease[K]
	var failure error
	for i, err := range errs {
		if err != nil {
			failure = err
			failed = append(failed, leases[i])
		}
	}
	if failure != nil {
		r.storeFailed(failure) // once for the call
	}
	return failed
}
