package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/inflight-go/inflight/internal/keys"
	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Acquire calls that overlap share pipelines. While maxSending calls (or
// pipelines of calls) are on their way to the store, later calls queue; each
// time one comes back, everything queued goes as one pipeline: one write
// and one read for many calls. A caller alone sends its call at once, as a
// plain EVALSHA.
//
// A waiter's first call is ordered: it reaches the store after every ordered
// call on any of its capped keys made before it in this process, so that
// the process's waiters take their places in the fleet's queue in the
// order they came. While an ordered call on a key is on its way, later
// ordered calls on that key queue for the pipeline that follows it. A
// waiter lets the next waiter of its keys call as soon as its own call is
// placed (see Registry.placed): sent, or queued within a pipeline's reach
// (fewer than maxPipeline calls of any kind ahead of it; one further back
// is placed once those ahead of it have gone). So a process sends a burst
// of waiters in pipelines of maxPipeline, one round trip each, whatever
// their keys, and queues hardly more of them than the next pipeline takes
// (one more a key at most, each holding back the waiters after it): none
// waits out its call timeout in the queue while the store answers.
//
// The claims of grants have a lane of their own, beside the admissions',
// and never wait behind them. On a store whose Admit is one round trip
// (driver.Pipeliner) up to maxClaiming go at once, and the claims made
// while that many are on their way share the next pipeline: a release
// that grants a hundred waiters of a process at once sends their claims
// in a few calls, not in a call (and a connection) each. Only so large a
// burst pays the round trip a claim waits for a pipeline: on a Redis 40
// ms away, with callers arriving faster than the key frees them and
// giving up after 2 s, two claims at once admitted a quarter as many at
// the end as claims sent each alone (TestOverloadOnAFarRedisKeepsAdmitting).
// On any other store each claim goes at once, alone (see claimSlots).
const (
	maxSending  = 2
	maxClaiming = 16
	maxPipeline = 128
)

var (
	// errBreakerOpen: a queued call was not sent, because the breaker
	// opened while it waited.
	errBreakerOpen = errors.New("fleet: breaker open")
	// errQueueTimeout: a call queued for a pipeline for the whole call
	// timeout was not sent.
	errQueueTimeout = errors.New("fleet: acquire call queued for the whole call timeout")
)

// lanes are the Registry's queues of acquire calls: admissions, and the
// claims of grants.
type lanes struct {
	calls  calls
	claims calls // never ordered
}

// claimSlots is how many claims a Registry sends at once on s before
// later ones queue for a pipeline: maxClaiming where Admit is one round
// trip, else no bound.
func claimSlots(s driver.Store) int {
	if p, ok := s.(driver.Pipeliner); ok && p.Pipelines() {
		return maxClaiming
	}
	return math.MaxInt
}

// calls is a queue of acquire calls.
type calls struct {
	mu      sync.Mutex // protects the fields below
	sending int        // calls and pipelines on their way
	max     int        // maxSending, claimSlots for claims (tests lower it)
	pending []*scriptCall
	// ordered counts, per capped key, the ordered calls on their way.
	ordered map[string]int
	closed  bool
}

// scriptCall is a queued admission call.
type scriptCall struct {
	call    *driver.AdmitCall
	ordered bool // a waiter's call: see calls
	// placed, for an ordered call queued beyond a pipeline's reach, tells
	// its waiter once it is within it (then nil; guarded by calls.mu).
	placed   func()
	until    int64     // its not-after time (see clock.go)
	deadline time.Time // when it was queued, plus the call timeout
	taken    bool      // put into a pipeline (guarded by calls.mu)
	reply    reply
	done     chan struct{} // closed once reply is set
}

// reply is how an admission call went.
type reply struct {
	res driver.AdmitResult
	err error
	// sent: the call may have reached the store. If it failed, whatever it
	// added must be taken back (the lease id abandoned). The breaker has
	// counted it already: a pipeline counts once for all its calls.
	sent bool
}

// call makes the admission call ac: at once if fewer than its lane's max
// calls are on their way there (and, for an ordered call, none ordered on
// one of its keys), else queued for the lane's next pipeline. The claim of
// a grant goes in the lane of claims, beside the admissions: its grant
// holds a place that nobody uses until it is claimed, and there are at
// most as many claims as places released meanwhile. A call sent at once
// ends within the call timeout d; a queued one is sent within d or
// dropped, and its pipeline ends by d after its newest call was made:
// within 2d in all. A caller whose ctx ends first stops waiting (and its
// call, if not sent yet, is never sent). until is the call's not-after
// time (see clock.go). placed, if not nil, makes the call ordered, and is
// called once it has its place: sent, or queued within a pipeline's reach
// behind the calls it must follow (never if the call is not sent).
func (r *Registry[K]) call(ctx context.Context, ac *driver.AdmitCall, until int64, placed func(), claim bool) reply {
	q := &r.calls
	ordered := placed != nil
	if claim && !ordered {
		q = &r.claims
	}
	capped := ac.Keys
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return reply{err: ErrClosed}
	}
	if q.sending < q.max && (!ordered || !q.followsLocked(capped)) {
		q.sending++
		if ordered {
			q.sendingLocked(capped, 1)
		}
		q.mu.Unlock()
		defer r.doneSending(q, capped, ordered) // even if the call panics: the queue must go on
		if ordered {
			placed()
		}
		return r.callAlone(ctx, ac)
	}
	deadline := time.Now().Add(r.cfg.opTimeout)
	c := &scriptCall{call: ac, ordered: ordered, until: until, deadline: deadline, done: make(chan struct{})}
	announce := ordered && len(q.pending) < maxPipeline
	if ordered && !announce {
		c.placed = placed // once those ahead of it have gone (takeLocked)
	}
	q.pending = append(q.pending, c)
	q.mu.Unlock()
	if announce {
		placed()
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-c.done:
		return c.reply
	case <-ctx.Done():
		return q.giveUp(c, ctx.Err())
	case <-timer.C:
	}
	// Its time is up. Still queued, it is dropped: the store is too slow to
	// take it, which counts as a failure. On its way, it waits for its
	// pipeline, which ends by the newest deadline of its calls: a caller
	// that gave up now would be decided without the store's answer.
	q.mu.Lock()
	if q.closed && !c.taken { // Close failed it as the timer fired
		q.mu.Unlock()
		return reply{err: ErrClosed}
	}
	if !c.taken {
		q.removeLocked(c)
		q.mu.Unlock()
		r.storeFailed(errQueueTimeout)
		return reply{err: errQueueTimeout}
	}
	q.mu.Unlock()
	select {
	case <-c.done:
		return c.reply
	case <-ctx.Done():
		return reply{err: ctx.Err(), sent: true}
	}
}

// giveUp takes c back for a caller that stops waiting with err: out of the
// queue if it is still there (then it is never sent).
func (q *calls) giveUp(c *scriptCall, err error) reply {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.taken {
		return reply{err: err, sent: true}
	}
	q.removeLocked(c)
	return reply{err: err}
}

// removeLocked takes c, not sent, out of the queue.
func (q *calls) removeLocked(c *scriptCall) {
	q.pending = slices.DeleteFunc(q.pending, func(p *scriptCall) bool { return p == c })
	q.trimLocked()
}

// trimLocked lets the array of the queue go once a burst has passed:
// slices.Delete keeps a slice's capacity.
func (q *calls) trimLocked() { q.pending = keys.Trimmed(q.pending, minRemade) }

// callAlone sends one call alone, and lets the breaker count how it went
// (unless the caller's ctx ended: that is not the store's failure). The
// breaker counts before any call queued meanwhile is sent, so that those
// see it open.
func (r *Registry[K]) callAlone(ctx context.Context, ac *driver.AdmitCall) reply {
	if err := ctx.Err(); err != nil {
		return reply{err: err} // not sent: nothing to take back
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.opTimeout)
	defer cancel()
	sent := r.clock.local()
	// A panic (a client's hook) goes on to the caller, whose call takes
	// back what it may have added (see callOrAbandon).
	res, err := r.store.AdmitOne(cctx, ac)
	switch {
	case err == nil || errors.Is(err, driver.ErrBadReply): // the store answered
		if err == nil {
			r.sawClock(res, sent)
		}
		if r.brk.success() {
			r.recovered()
		}
	case ctx.Err() == nil:
		r.storeFailed(err)
	}
	return reply{res: res, err: err, sent: true}
}

// sawClock records the store's clock of an admission's result res, to a
// call sent at the local reading sent.
func (r *Registry[K]) sawClock(res driver.AdmitResult, sent int64) {
	r.clock.seen(res.Now, sent, r.clock.local())
}

// safeStore calls f, a call to the store, with a panic (in a client or a
// hook) turned into its error.
func safeStore[T any](f func() (T, error)) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("fleet: panic in a call to the store: %v", p)
		}
	}()
	return f()
}

// doneSending follows a call of q sent alone on capped keys: if calls
// queued meanwhile, a goroutine sends them in pipelines until q is empty.
func (r *Registry[K]) doneSending(q *calls, capped []string, ordered bool) {
	q.mu.Lock()
	if ordered {
		q.sendingLocked(capped, -1)
	}
	batch, placed := q.takeLocked()
	if batch == nil {
		q.sending--
		q.mu.Unlock()
		tell(placed)
		return
	}
	r.done.Add(1) // before Close waits: Close sets q.closed first
	q.mu.Unlock()
	tell(placed)
	go r.sendPipelines(q, batch)
}

// takeLocked takes the queued calls, up to a pipeline, oldest first, but
// for an ordered call on a key an ordered call is on its way on, and any
// ordered call after it on one of its keys; nil if none can go or the
// Registry is closed. It returns too the placed functions of the ordered
// calls now within a pipeline's reach, to be called once calls.mu is
// unlocked.
func (q *calls) takeLocked() (batch []*scriptCall, placed []func()) {
	if q.closed || len(q.pending) == 0 {
		return nil, nil
	}
	var rest []*scriptCall
	var held map[string]bool // keys of ordered calls left queued
	for i, c := range q.pending {
		if len(batch) == maxPipeline {
			rest = append(rest, q.pending[i:]...)
			break
		}
		if c.ordered && q.holdsLocked(c, held) {
			if held == nil {
				held = map[string]bool{}
			}
			for _, k := range c.cappedKeys() {
				held[k] = true
			}
			rest = append(rest, c)
			continue
		}
		batch = append(batch, c)
	}
	clear(q.pending)
	q.pending = rest
	q.trimLocked()
	for _, c := range batch {
		c.taken = true
		if c.ordered {
			q.sendingLocked(c.cappedKeys(), 1)
		}
		if c.placed != nil {
			placed = append(placed, c.placed)
			c.placed = nil
		}
	}
	// Those left queued that are now within a pipeline's reach.
	for _, c := range q.pending[:min(len(q.pending), maxPipeline)] {
		if c.placed != nil {
			placed = append(placed, c.placed)
			c.placed = nil
		}
	}
	return batch, placed
}

// close fails the queued calls (never sent) and keeps new ones from
// queueing: Close calls it before it waits for the goroutines.
func (q *calls) close() {
	q.mu.Lock()
	q.closed = true
	pending := q.pending
	q.pending = nil
	q.mu.Unlock()
	for _, c := range pending {
		c.reply = reply{err: ErrClosed}
		close(c.done)
	}
}

// sendPipelines sends batch, then whatever queued in q meanwhile, until
// nothing is queued.
func (r *Registry[K]) sendPipelines(q *calls, batch []*scriptCall) {
	defer r.done.Done()
	for batch != nil {
		r.sendPipeline(batch)
		q.mu.Lock()
		for _, c := range batch {
			if c.ordered {
				q.sendingLocked(c.cappedKeys(), -1)
			}
		}
		var placed []func()
		batch, placed = q.takeLocked()
		if batch == nil {
			q.sending--
		}
		q.mu.Unlock()
		tell(placed)
	}
}

// sendPipeline sends batch as one pipeline, ending by its newest call's
// deadline (or at Close), and hands each call its reply. The breaker counts
// the pipeline once, as one success or one failure. If Close cut the
// pipeline short, its calls fail with ErrClosed and are then abandoned
// here, in one call.
func (r *Registry[K]) sendPipeline(batch []*scriptCall) {
	if !r.brk.allow() {
		for _, c := range batch {
			c.reply = reply{err: errBreakerOpen}
			close(c.done)
		}
		return
	}
	// Until its newest call's deadline, so that no call is cut short by an
	// older one's; a caller whose own deadline passes meanwhile waits for
	// this reply (see call).
	ctx, cancel := context.WithDeadline(r.stopping, batch[len(batch)-1].deadline)
	defer cancel()
	calls := make([]*driver.AdmitCall, len(batch))
	for i, c := range batch {
		calls[i] = c.call
	}
	sent := r.clock.local()
	results, perr := safeStore(func() ([]driver.AdmitResult, error) { return r.store.Admit(ctx, calls) })
	if perr == nil && len(results) != len(batch) {
		perr = fmt.Errorf("fleet: %d results for %d admission calls", len(results), len(batch))
	}
	if r.stopping.Err() != nil {
		// The callers learn at once; Close waits for this goroutine, so
		// the abandon still comes before Close returns. Also when Close
		// cut the pipeline (perr): its calls may have run.
		for _, c := range batch {
			c.reply = reply{err: ErrClosed}
			close(c.done)
		}
		r.abandonCalls(batch)
		return
	}
	if perr != nil { // the store failed them all, or panicked (a client hook): fail the calls, keep the process
		r.storeFailed(perr)
		for _, c := range batch {
			c.reply = reply{err: perr, sent: true}
			close(c.done)
		}
		return
	}
	var failure error
	for i, c := range batch {
		c.reply.res, c.reply.err = results[i], results[i].Err
		c.reply.sent = true
		if failure == nil && !errors.Is(c.reply.err, driver.ErrBadReply) {
			failure = c.reply.err
		}
	}
	if last := batch[len(batch)-1].reply; failure == nil && last.err == nil {
		r.sawClock(last.res, sent)
	}
	switch {
	case failure != nil:
		r.storeFailed(failure)
	case r.brk.success():
		r.recovered()
	}
	for _, c := range batch {
		close(c.done)
	}
}

// abandonCalls takes back what the calls may have added (see takeBack),
// unless the store is unreachable: then the leases expire after the TTL.
func (r *Registry[K]) abandonCalls(batch []*scriptCall) {
	if !r.brk.allow() {
		return
	}
	leases := make([]*lease[K], len(batch))
	for i, c := range batch {
		leases[i] = &lease[K]{r: r, id: c.call.Lease, names: c.call.Keys, limits: c.call.Limits, until: c.until, abandoned: true}
	}
	r.remove(context.Background(), leases)
}
