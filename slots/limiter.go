package slots

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inflight-go/inflight/internal/clockx"
	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/policy"
)

// zeroClock serves zero-value Limiters; NewLimiter gives each its own.
var zeroClock = clockx.New(nil)

// saturationLogEvery spaces the fail-open saturation warnings.
const saturationLogEvery = 10 * time.Second

// Limiter caps how many Slots are held at once from one pool. Waiters are
// admitted in arrival order; TryAcquire does not pass them.
//
// Callers may be given a priority class (WithPriority) and a flow
// (WithFlow): then the highest class that may take a freed slot goes first,
// flows within a class take turns, and each flow is served in arrival
// order. WithShare guarantees classes a part of the limit so that none
// starves. Without them every caller is in one class and one flow, and the
// queue is plain FIFO.
//
// The zero value is a Limiter with limit 0 and the default policy: it admits
// nothing until SetLimit raises the limit.
type Limiter struct {
	wait policy.Wait
	clk  *clockx.Clock
	obs  Observer // nil: no events

	mu    sync.Mutex // protects the fields below
	lane  core.Lane  // lane.Limit is the limit
	seq   uint64     // last holder id
	stats Stats      // outcome totals; InFlight and Waiting are filled on read

	doubleReleases atomic.Uint64
	leaks          atomic.Uint64
	hold           policy.HoldTime
	satLog         policy.Every
}

// Stats are a Limiter's counts: the current state and totals since creation.
type Stats struct {
	InFlight int // slots held now
	Waiting  int // callers waiting now
	Limit    int

	Acquired       uint64 // admissions that took capacity (immediate or after waiting)
	Waited         uint64 // of Acquired, those that had to wait
	Released       uint64 // capacity given back (including grants returned by a cancelled waiter)
	Bypassed       uint64 // fail-open admissions without capacity
	LimitReached   uint64 // TryAcquire rejections
	QueueFull      uint64 // rejections by WithMaxQueue
	WaitTimeouts   uint64 // fail-closed rejections by WithMaxWait
	Canceled       uint64 // waits ended by the context
	DoubleReleases uint64 // Release calls on a slot already released
	Leaked         uint64 // slots dropped while held and reclaimed (WithLeakDetection)
}

// NewLimiter returns a Limiter that admits at most limit holders at once.
// Use Unlimited for a limiter that never binds. It panics if limit is
// negative.
func NewLimiter(limit int, opts ...Option) *Limiter {
	if limit < 0 {
		panic(fmt.Sprintf("slots: negative limit %d", limit))
	}
	l := &Limiter{}
	l.lane.Limit = limit
	for _, o := range opts {
		o.apply(&l.wait)
	}
	l.lane.Shares = l.wait.Shares
	l.clk = clockx.New(l.wait.Clock)
	l.obs, _ = l.wait.Observer.(Observer)
	return l
}

func (l *Limiter) clock() *clockx.Clock {
	if l.clk == nil {
		return zeroClock
	}
	return l.clk
}

// TryAcquire admits a Slot if one is free and nobody is waiting, without
// waiting. Otherwise it returns a *LimitError wrapping ErrLimitReached.
func (l *Limiter) TryAcquire() (*Slot, error) {
	s, h, t := l.newHold()
	h.At = l.clock().Coarse()

	l.mu.Lock()
	if !l.lane.Admits(core.ClassDefault) {
		l.stats.LimitReached++
		err := l.rejectLocked(ErrLimitReached)
		l.mu.Unlock()
		l.emit(Event{Kind: EventRejected, Err: ErrLimitReached})
		return nil, err
	}
	l.admitLocked(h)
	l.mu.Unlock()
	return l.acquired(s, t, 0), nil
}

// acquired hands out an admitted Slot and reports it. If the Observer
// panics the Slot is released, since it never reaches its caller.
func (l *Limiter) acquired(s *Slot, t *core.Tracked, wait time.Duration) *Slot {
	s = handOut(s, t)
	if l.obs != nil {
		ok := false
		defer func() {
			if !ok {
				s.Release()
			}
		}()
		l.obs.Observe(Event{Kind: EventAcquired, Wait: wait})
		ok = true
	}
	return s
}

// newHold returns a new Slot and the hold to admit for it: the Slot's own,
// or with leak detection a tracked one apart from it (see core.Tracked).
func (l *Limiter) newHold() (*Slot, *core.Hold, *core.Tracked) {
	s := new(Slot)
	if !l.wait.LeakCheck {
		s.h.Owner = l.owner()
		return s, &s.h, nil
	}
	t := new(core.Tracked)
	t.Owner = l.owner()
	if l.wait.LeakSites {
		t.RecordSite(2) // above newHold and TryAcquire or Acquire
	}
	return s, &t.Hold, t
}

// handOut finishes an admission: with leak detection, s becomes the stand-in
// of its tracked hold t.
func handOut(s *Slot, t *core.Tracked) *Slot {
	if t != nil {
		core.AttachTo(t, s, &s.h)
	}
	return s
}

// emit hands e to the Observer, if there is one. Call without the lock.
func (l *Limiter) emit(e Event) {
	if l.obs != nil {
		l.obs.Observe(e)
	}
}

// Acquire admits a Slot, waiting in arrival order while the limiter is full.
// It fails with a *LimitError wrapping ErrQueueFull (too many waiting) or
// ErrWaitTimeout (WithMaxWait passed), or with an error wrapping ctx.Err().
// A context that is already done fails even if a slot is free. With
// WithFailOpen, a wait that reaches the maximum returns a Bypassed slot.
// A nil ctx fails with ErrNilContext.
func (l *Limiter) Acquire(ctx context.Context) (*Slot, error) {
	if ctx == nil {
		l.emit(Event{Kind: EventRejected, Err: ErrNilContext})
		return nil, ErrNilContext
	}
	clk := l.clock()
	s, h, t := l.newHold()
	h.At = clk.Coarse()
	// The caller's place matters to an admission only with shares; without
	// them it is read once the caller has to wait.
	var place core.Place
	placed := l.lane.Shares != nil
	if placed {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}

	l.mu.Lock()
	// Whether the context has ended is decided under the lock, with the
	// admission: checked before it, a context that ends and a slot that
	// frees in between would admit a caller that has given up.
	if core.Ended(ctx) {
		l.mu.Unlock()
		l.emit(Event{Kind: EventRejected, Err: ctx.Err()})
		return nil, fmt.Errorf("slots: acquire: %w", ctx.Err())
	}
	if l.lane.Admits(h.Class) {
		l.admitLocked(h)
		l.mu.Unlock()
		return l.acquired(s, t, 0), nil
	}
	if !placed {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	if l.wait.QueueFull(l.lane.Waiters.Len()) ||
		l.wait.BoundFlowQueue && l.wait.FlowQueueFull(l.lane.Waiters.FlowLen(place.Flow)) {
		l.stats.QueueFull++
		err := l.rejectLocked(ErrQueueFull)
		l.mu.Unlock()
		l.emit(Event{Kind: EventRejected, Err: ErrQueueFull})
		return nil, err
	}
	start := h.At
	w := core.NewWaiter(h)
	w.Place(place)
	l.lane.Waiters.Push(&w.Elem)
	l.mu.Unlock()

	var expire <-chan time.Time
	if l.wait.MaxWait > 0 {
		c, stop := clk.Timer(l.wait.MaxWait)
		defer stop()
		expire = c
	}
	out := core.Await(ctx, w, expire, l.withdraw)
	switch out {
	case core.OutGranted:
		return l.acquired(s, t, time.Duration(h.At-start)), nil
	case core.OutCanceled:
		l.mu.Lock()
		l.stats.Canceled++
		l.mu.Unlock()
		l.emit(Event{Kind: EventRejected, Err: ctx.Err()})
		return nil, fmt.Errorf("slots: acquire: %w", ctx.Err())
	}
	// Expired.
	l.mu.Lock()
	if l.wait.FailOpen {
		l.stats.Bypassed++
		l.seq++
		h.ID = l.seq
		inFlight, limit, queued := l.lane.Holders.Len(), l.lane.Limit, l.lane.Waiters.Len()
		l.mu.Unlock()
		core.Bypass(h)
		h.At = clk.Coarse() // the clock start was read on
		if l.satLog.Allow(h.At, saturationLogEvery) {
			l.wait.Log().Warn("slots: limiter saturated; admitting without a slot (fail-open)",
				slog.Int("in_flight", inFlight), slog.Int("limit", limit), slog.Int("queued", queued),
				slog.Duration("max_wait", l.wait.MaxWait), slog.Uint64("slot_id", h.ID))
		}
		l.emit(Event{Kind: EventBypassed, Wait: time.Duration(h.At - start)})
		return handOut(s, t), nil
	}
	l.stats.WaitTimeouts++
	err := l.rejectLocked(ErrWaitTimeout)
	l.mu.Unlock()
	l.emit(Event{Kind: EventRejected, Err: ErrWaitTimeout})
	return nil, err
}

// withdraw takes w out of the queue if it is still waiting.
func (l *Limiter) withdraw(w *core.Waiter) bool {
	var wk core.Wakes
	l.mu.Lock()
	ok := l.lane.Withdraw(w)
	if ok && l.lane.Shares != nil {
		// A class that stops waiting stops keeping its minimum share from
		// the others, which may now take it.
		l.grantLocked(&wk)
	}
	l.mu.Unlock()
	wk.Wake()
	return ok
}

func (l *Limiter) admitLocked(h *core.Hold) {
	l.seq++
	h.ID = l.seq
	l.lane.Holders.Add(h, &h.Idx)
	l.stats.Acquired++
}

// grantLocked admits waiters in order while there is room; wk wakes them.
func (l *Limiter) grantLocked(wk *core.Wakes) {
	var now int64
	for {
		e := l.lane.Next()
		if e == nil {
			return
		}
		w := e.Value
		l.lane.Waiters.Served(e)
		if now == 0 {
			now = l.clock().Coarse()
		}
		w.Hold.At = now
		l.admitLocked(w.Hold)
		l.stats.Waited++
		wk.Grant(w)
	}
}

func (l *Limiter) rejectLocked(reason error) error {
	queued := l.lane.Waiters.Len()
	return &LimitError{
		Err:        reason,
		InFlight:   l.lane.Holders.Len(),
		Limit:      l.lane.Limit,
		Queued:     queued,
		RetryAfter: l.hold.RetryAfter(queued, l.lane.Limit),
	}
}

// owner is the Limiter as the core.Owner of its holds: a defined type, so
// that these methods stay off the Limiter's public method set.
type owner Limiter

func (l *Limiter) owner() *owner { return (*owner)(l) }

// Release implements core.Owner; called once per admitted hold.
func (o *owner) Release(h *core.Hold) bool {
	l := (*Limiter)(o)
	var wk core.Wakes
	l.mu.Lock()
	if !l.lane.Holders.Remove(h, &h.Idx) {
		l.mu.Unlock()
		o.Misuse(h) // a copied Slot: it holds nothing
		return false
	}
	l.stats.Released++
	l.grantLocked(&wk)
	l.mu.Unlock()
	wk.Wake()
	if h.ID&policy.SampleMask == 0 {
		l.hold.Observe(l.clock().Nanos() - h.At)
	}
	if l.obs != nil && !h.GivenBack {
		l.obs.Observe(Event{Kind: EventReleased, Hold: time.Duration(l.clock().Coarse() - h.At)})
	}
	return true
}

// Misuse implements core.Owner: a second Release of the same slot.
func (o *owner) Misuse(h *core.Hold) {
	l := (*Limiter)(o)
	l.doubleReleases.Add(1)
	l.emit(Event{Kind: EventDoubleRelease})
	l.wait.Log().Debug("slots: slot released twice", slog.Uint64("slot_id", h.ID))
}

// Time implements core.Owner.
func (o *owner) Time(at int64) time.Time { return (*Limiter)(o).clock().Time(at) }

// Reclaim implements core.Leaker: a Slot was dropped while held.
func (o *owner) Reclaim(t *core.Tracked) {
	if !t.ReleaseQuietly() {
		return
	}
	l := (*Limiter)(o)
	held := time.Duration(l.clock().Coarse() - t.At)
	l.leaks.Add(1)
	attrs := []any{slog.Uint64("slot_id", t.ID), slog.Duration("held_for", held.Round(time.Millisecond))}
	if site := t.Site(); site != "" {
		attrs = append(attrs, slog.String("acquired_at", site))
	}
	l.wait.Log().Warn("slots: slot dropped without Release; capacity reclaimed", attrs...)
	l.emit(Event{Kind: EventLeaked, Hold: held})
}

// SetLimit changes the limit. Raising it admits waiters in arrival order at
// once; lowering it never takes a slot from a holder: admissions resume when
// enough holders have released. A negative n is ignored (and logged).
func (l *Limiter) SetLimit(n int) {
	if n < 0 {
		l.wait.Log().Warn("slots: SetLimit with a negative limit ignored", slog.Int("limit", n))
		return
	}
	var wk core.Wakes
	l.mu.Lock()
	l.lane.Limit = n
	l.grantLocked(&wk)
	l.mu.Unlock()
	wk.Wake()
}

// Limit returns the current limit.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lane.Limit
}

// InFlight returns the number of slots held now (bypassed slots excluded).
func (l *Limiter) InFlight() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lane.Holders.Len()
}

// Waiting returns the number of callers waiting in Acquire now.
func (l *Limiter) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lane.Waiters.Len()
}

// Stats returns the current counts and the totals since creation.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	st := l.stats
	st.InFlight = l.lane.Holders.Len()
	st.Waiting = l.lane.Waiters.Len()
	st.Limit = l.lane.Limit
	l.mu.Unlock()
	st.DoubleReleases = l.doubleReleases.Load()
	st.Leaked = l.leaks.Load()
	return st
}

// Queue describes the callers waiting now: per priority class, and the
// flows with the most waiters.
func (l *Limiter) Queue() QueueStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return queueStats(&l.lane.Waiters)
}

// Holder describes one live holder, for sweeps and debugging.
type Holder struct {
	ID         uint64
	AcquiredAt time.Time
}

// Holders appends the live holders, in no particular order, to dst and
// returns it.
func (l *Limiter) Holders(dst []Holder) []Holder {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.lane.Holders.Len() {
		h := l.lane.Holders.At(i)
		dst = append(dst, Holder{ID: h.ID, AcquiredAt: l.clock().Time(h.At)})
	}
	return dst
}
