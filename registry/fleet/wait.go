package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// A waiting Acquire: its place in the fleet's queue (PROTOCOL.md,
// "Waiting"), the tries and the sleeps between them, and how a wait ends.
// The order of this process's own waiters, used while they cannot queue in
// the store, is in waiters.go.

// admit decides for l once, or with wait until it is admitted or fails for
// good. A waiter queues in the fleet's queue (see PROTOCOL.md) and sleeps
// until its grant's wake-up, asking again at least once a claim window in
// case a wake-up was lost; one that gives up withdraws its place.
func (r *Registry[K]) admit(ctx context.Context, l *lease[K], wait bool) (*slots.Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fleet: acquire: %w", err)
	}
	if !wait {
		o := r.attempt(ctx, ctx, l, nil)
		return o.slot, o.err
	}
	place := core.PlaceOf(ctx)
	w := &waiter{rank: core.Rank(place.Class), flow: place.Flow, weight: max(int(place.Weight), 1),
		keys: l.names, units: l.units, wake: make(chan struct{}, 1)}
	if err := r.enqueue(w); err != nil {
		return nil, err
	}
	defer r.dequeue(w)
	// The longest wait bounds the sleeps between tries and the calls to
	// the store; a lease the store has admitted is recorded under ctx and held,
	// not given back for a bypass.
	wctx := ctx
	if r.maxWait > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, r.maxWait)
		defer cancel()
	}
	// A panic (a Keys.Limit's, a client hook's) takes its place back too.
	ok := false
	defer func() {
		if !ok {
			r.leaveQueue(l, w)
		}
	}()
	o, last := r.wait(ctx, wctx, l, w)
	ok = true
	if o.slot != nil {
		return o.slot, nil
	}
	r.leaveQueue(l, w)
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	switch {
	case errors.Is(o.err, ErrClosed) || closed:
		return nil, ErrClosed
	case ctx.Err() != nil:
		err := fmt.Errorf("fleet: acquire: %w", ctx.Err())
		if errors.Is(err, context.DeadlineExceeded) && last.full >= 0 {
			// A server's deadline: told when its turn was expected, as if
			// its wait had timed out.
			err = core.RetryLater(err, r.timedOut(l, last).RetryAfter)
		}
		return nil, err
	case wctx.Err() != nil && errors.Is(o.err, context.DeadlineExceeded):
		o = r.waitedTooLong(l, last)
	}
	return o.slot, o.err
}

// waitedTooLong answers a wait for l that ran past the longest wait
// (slots.WithMaxWait), whose last try found it waiting as last: a
// Bypassed Slot that holds nothing with slots.WithFailOpen, else a
// *slots.LimitError wrapping slots.ErrWaitTimeout that names the key it
// waited for.
func (r *Registry[K]) waitedTooLong(l *lease[K], last outcome) outcome {
	if r.failOpen {
		if r.bypassLog.Allow(time.Now().UnixNano(), 10*time.Second) {
			r.logSafely(slog.LevelWarn, "fleet: saturated; admitting without a slot (fail-open)",
				slog.String("registry", r.prefix), slog.Duration("max_wait", r.maxWait))
		}
		return r.bypass(l, false)
	}
	return failed(r.timedOut(l, last))
}

// timedOut is the refusal of a wait for l that timed out, whose last try
// found it waiting as last.
func (r *Registry[K]) timedOut(l *lease[K], last outcome) *slots.LimitError {
	i := max(last.full, 0)
	le := &slots.LimitError{Err: slots.ErrWaitTimeout, Key: r.keyName(l.keys[i]), InFlight: last.inFlight, Queued: last.queuedN}
	if last.queued && last.full >= 0 {
		le.Queued = max(le.Queued-1, 0) // the store's count was its own ticket's too: it has left
	}
	if len(l.limits) > i {
		le.Limit = l.limits[i]
	}
	le.RetryAfter = r.holdTime.RetryAfter(0, l.units, needOf(le.Queued, l.units), le.Limit, nil, 0, nil)
	if last.full >= 0 && i < len(l.names) {
		// It may queue again on its return: told to come a little early
		// (not before a pause it waited in ends).
		le.RetryAfter = r.refusalRetryAfter(l, i, le, le.Queued, r.maxWait/2, time.Until(last.resume), true)
	}
	return le
}

// leaveQueue takes back w's place in the fleet's queue, or the grant it
// has not claimed, if it was queued as l's current id, and reports whether
// it did (see sendAbandonment). It leaves l as it is: l may be on its way
// out already (given back), read by the releaser.
func (r *Registry[K]) leaveQueue(l *lease[K], w *waiter) bool {
	if w == nil || w.queuedAs == "" || w.queuedAs != l.id {
		return false
	}
	w.queuedAs = ""
	r.sendAbandonment(l)
	return true
}

// wait tries for l until it is admitted or fails for good, trying under
// ctx and sleeping between tries under wctx (ctx bounded by the longest
// wait). It returns the outcome, and the last one that found l waiting.
func (r *Registry[K]) wait(ctx, wctx context.Context, l *lease[K], w *waiter) (o, last outcome) {
	backoff := r.cfg.pollMin
	last = failed(nil)
	for {
		if ok, held := r.mayTry(w); !ok {
			if held >= 0 {
				if i, n := r.lineUp(w, held); i >= 0 {
					return r.queueFull(l, i, n), last
				}
			}
			if err := r.sleep(wctx, w, r.cfg.pollMax); err != nil {
				return failed(err), last
			}
			continue
		}
		r.expect(w, l.id)
		o = r.attempt(ctx, wctx, l, w)
		if o.gone && w.queuedAs == l.id {
			// Its grant, claimed, went back with the lease (the caller
			// left, or Close came): its place is gone already; a second
			// abandon of the id (leaveQueue) would only wait for the store
			// again, and once the Registry is closed, count a second drop.
			w.queuedAs = ""
		}
		if o.full >= 0 {
			last = o
		}
		var sleep time.Duration
		switch {
		case o.queued:
			// Its grant wakes it. It asks again within a claim window, in
			// case a wake-up was lost, and when the key's earliest lease
			// expires (a grant nobody claims, a holder that died): nothing
			// else serves the queue then.
			// The key the store names full (a driver may name none: then
			// the only key, or none of several, which it may not wait on).
			full := ""
			if o.full >= 0 && o.full < len(l.names) {
				full = l.names[o.full]
			} else if len(l.names) == 1 {
				full = l.names[0]
			}
			r.queuedIn(w, l.id, full)
			sleep = jitter(r.claim)
			if o.retryIn > 0 {
				sleep = min(sleep, o.retryIn+jitter(r.cfg.pollMin))
			}
		case o.retry:
			// Its call timed out, the store still reachable: it asks
			// again (under a new id, at the back of the queue: the call
			// may have run), after a backoff. Its place in the fleet's
			// queue went back with a call sent (takeBack): a newcomer does
			// not leave it the room meanwhile (see fleet), which nobody
			// would take. A call dropped before it was sent
			// (errQueueTimeout) gave nothing back: it keeps its place.
			if w.queuedAs != l.id {
				r.leftFleet(w)
			}
			sleep = jitter(backoff)
			backoff = min(2*backoff, r.cfg.pollMax)
		case o.full < 0:
			return o, last // admitted, or failed for good
		case o.paused:
			// Nothing is admitted before the pause ends: wait for it (or
			// a wake-up), jittered so that the fleet's waiters do not all
			// ask at the same instant. Still waiting, not an error. A
			// queued one asks within a claim window meanwhile, as its
			// process's liveness, which keeps its place, is renewed only
			// so (a pause outlasts it).
			r.blockedOn(w, l.names[o.full], false)
			sleep = o.retryIn + jitter(r.cfg.pollMin)
			if w.queuedAs == l.id {
				sleep = min(sleep, jitter(r.claim))
			}
		default:
			// Full under the local registry (the store unreachable): wait,
			// within the queue's bounds (see lineUp), for a wake-up, at
			// most the backoff (jittered). (Else the store admitted l, given
			// back for a lease admitted outside it meanwhile, or over a
			// learned cap cut twice: the store's bounds bound it.)
			if o.local {
				if i, n := r.lineUp(w, o.full); i >= 0 {
					return r.queueFull(l, i, n), last
				}
			}
			if r.fullHook != nil {
				r.fullHook()
			}
			r.blockedOn(w, l.names[o.full], o.local)
			if o.outside && r.givenBack(w, o.seen) {
				continue // the lease outside went in: it asks the store again
			}
			if (o.local || o.outside) && r.localHeld(l.keys[o.full]) < o.inFlight {
				// A release freed room on the key since the try counted its
				// holders, before w recorded the key: its wake-up (wokenBy)
				// passed w by, which held back no key while its call had its
				// place in line (see placed). Once recorded, a later release
				// wakes w while the breaker is open or this process holds or
				// admits a lease outside the store (see releasing); one before
				// is seen now. (Once the lease outside is put into the store,
				// by a renewal or a call that carried it, the fleet's queue,
				// which w, given back, is not in, serves the releases: its
				// going in wakes w to queue there, see givenBack.)
				continue
			}
			sleep = jitter(backoff)
			backoff = min(2*backoff, r.cfg.pollMax)
		}
		if err := r.sleep(wctx, w, sleep); err != nil {
			return failed(err), last
		}
	}
}

// queueFull is the refusal of l, whose i-th key has queued waiters in
// this process's order at a bound of the queue (see lineUp).
func (r *Registry[K]) queueFull(l *lease[K], i, queued int) outcome {
	k := l.keys[i]
	le := &slots.LimitError{Err: slots.ErrQueueFull, Key: l.names[i], InFlight: r.localHeld(k), Limit: r.local.Limit(k),
		Queued: queued, RetryAfter: time.Second}
	le.RetryAfter = r.refusalRetryAfter(l, i, le, queued, 0, 0, true)
	return failed(le)
}

func (r *Registry[K]) sleep(ctx context.Context, w *waiter, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.wake:
	case <-t.C:
	case <-ctx.Done():
		return fmt.Errorf("fleet: acquire: %w", ctx.Err())
	case <-r.stopping.Done():
		return ErrClosed
	}
	return nil
}

// claimWindow is how long a grant of the fleet's queue waits for its
// waiter to claim it: long enough for a wake-up and a call, short enough
// that a waiter that died costs little. A queued waiter asks again within
// it in case its wake-up was lost, and so renews its process's liveness,
// whose TTL is five claim windows (at most the lease TTL).
func claimWindow(cfg config) time.Duration {
	return max(min(time.Second, cfg.ttl/3), 10*time.Millisecond)
}

// waitPolicy is what the wait options among a Registry's local options
// (WithLocalOptions) say of its fleet waits: the bounds of the fleet's
// queue per key and per flow (-1: none; slots.WithMaxQueue,
// slots.WithMaxQueuePerFlow), the longest wait (0: none; slots.WithMaxWait)
// and whether a wait that runs out admits a Bypassed Slot
// (slots.WithFailOpen).
type waitPolicy struct {
	maxQueue, maxFlowQueue int
	maxWait                time.Duration
	failOpen               bool
}

func waitPolicyOf(opts []registry.Option) waitPolicy {
	var s core.Settings
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.Apply(&s)
	}
	p := waitPolicy{maxQueue: -1, maxFlowQueue: -1, maxWait: max(s.Policy.MaxWait, 0), failOpen: s.Policy.FailOpen}
	if s.Policy.BoundQueue {
		p.maxQueue = max(s.Policy.MaxQueue, 0)
	}
	if s.Policy.BoundFlowQueue {
		p.maxFlowQueue = max(s.Policy.MaxFlowQueue, 0)
	}
	return p
}
