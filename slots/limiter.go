package slots

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/inflight-go/inflight/internal/core"
)

// Limiter caps the units held at once from one pool. TryAcquire does not
// pass waiters. The zero value admits nothing until SetLimit.
type Limiter struct {
	eng     core.Engine
	engInit sync.Once // readies eng: in NewLimiter, or at first use of a zero Limiter

	mu    sync.Mutex // protects the fields below
	lane  core.Lane  // lane.Limit is the limit
	seq   uint64     // last holder id
	stats Stats      // outcome totals; InFlight and Waiting are filled on read
}

// Stats are a Limiter's counts: now, and totals since creation.
type Stats struct {
	InFlight       int // units held now: slots, when each weighs one unit
	Waiting        int // callers waiting now
	Limit          int
	Acquired       uint64 // admissions that took capacity (immediate or after waiting)
	Waited         uint64 // of Acquired, those that had to wait
	Released       uint64 // capacity given back
	Bypassed       uint64 // fail-open admissions without capacity
	LimitReached   uint64 // TryAcquire rejections
	QueueFull      uint64 // rejections by WithMaxQueue
	ExceedsLimit   uint64 // rejections: heavier than the limit can hold
	WaitTimeouts   uint64 // fail-closed rejections by WithMaxWait
	Canceled       uint64 // calls whose context ended before a grant (one given back as it came counts as Acquired and Released)
	DoubleReleases uint64 // Release calls on a slot already released
	Leaked         uint64 // slots dropped while held and reclaimed (WithLeakDetection)
}

// NewLimiter returns a Limiter of limit units; it panics if limit < 0.
func NewLimiter(limit int, opts ...Option) *Limiter {
	if limit < 0 {
		panic(fmt.Sprintf("slots: negative limit %d", limit))
	}
	var st core.Settings
	core.Apply(&st, opts)
	l := &Limiter{eng: core.Engine{Policy: st.Policy}, lane: core.Lane{Limit: limit, Shares: st.Shares}}
	l.engine()
	return l
}

// engine returns l's engine, readied once.
func (l *Limiter) engine() *core.Engine {
	l.engInit.Do(func() { l.eng.Init("slots", asError) })
	return &l.eng
}

// TryAcquire admits a Slot if one is free and nobody waits.
func (l *Limiter) TryAcquire() (*Slot, error) { return l.acquire(nil, 1) }

// TryAcquireN is TryAcquire for n units (see AcquireN).
func (l *Limiter) TryAcquireN(n int) (*Slot, error) {
	if err := l.engine().Check(nil, n, false); err != nil {
		return nil, err
	}
	return l.acquire(nil, n)
}

// Acquire admits a Slot, waiting while the limiter is full. It fails with
// ErrQueueFull, ErrWaitTimeout or the context's error (even if a slot is
// free); WithFailOpen bypasses instead.
func (l *Limiter) Acquire(ctx context.Context) (*Slot, error) { return l.AcquireN(ctx, 1) }

// AcquireN is Acquire for n units, which later callers may pass up to a
// bound (package doc). It fails with ErrBadUnits, or ErrExceedsLimit when
// the limit, less other classes' guarantees, can never hold n (0: a pause).
func (l *Limiter) AcquireN(ctx context.Context, n int) (*Slot, error) {
	if err := l.engine().Check(ctx, n, true); err != nil {
		return nil, err
	}
	return l.acquire(ctx, n)
}

// acquire admits n units; ctx == nil means do not wait.
func (l *Limiter) acquire(ctx context.Context, n int) (*Slot, error) {
	e := l.engine()
	x, h, t := e.Begin(l.owner(), n, 1)
	// The caller's place matters to an admission only with shares; without
	// them it is read once the caller has to wait.
	var place core.Place
	if ctx != nil && l.lane.Shares != nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	var wk core.Wakes
	d := core.Admit()
	l.mu.Lock()
	switch {
	case core.Ended(ctx): // under the lock, with the admission (see core.Ended)
		d = core.Cancel()
		l.stats.Canceled++
	case l.lane.Admits(h.Class, n):
		l.admitLocked(h)
	default:
		d = l.refuseOrQueueLocked(ctx, h, n, place, &wk)
	}
	l.mu.Unlock()
	wk.Wake()
	x, err := e.Finish(ctx, x, t, d)
	return (*Slot)(x), err
}

// refuseOrQueueLocked decides for a caller of h, weighing n units, at place
// (read already with shares), that cannot be admitted now: it queues, or
// it is refused (ctx == nil: a call that does not wait), and counted.
func (l *Limiter) refuseOrQueueLocked(ctx context.Context, h *core.Hold, n int, place core.Place, wk *core.Wakes) core.Decision {
	if ctx != nil && l.lane.Shares == nil {
		place = core.PlaceOf(ctx)
		h.Class = place.Class
	}
	var reason error // why it may not queue either
	switch {
	case l.lane.TooHeavy(place.Class, n):
		l.stats.ExceedsLimit++
		reason = ErrExceedsLimit
	case ctx == nil:
		l.stats.LimitReached++
		reason = ErrLimitReached
	case l.engine().Full(&l.lane.Waiters, place.Flow): // counted once refused
		reason = ErrQueueFull
	}
	if reason == nil || reason == ErrQueueFull && l.lane.Waiters.Heavy() > 0 {
		w := l.eng.Waiter(h)
		w.Place(place)
		if l.lane.Waiters.Beside(w, reason, func() { l.grantLocked(wk) }) {
			return core.Wait(w, l.owner())
		}
	}
	if reason == ErrQueueFull {
		l.stats.QueueFull++
	}
	return core.Refuse(l.eng.RejectLane(reason, "", &l.lane, n, h.Class))
}

// Ended implements core.Waits: a wait that took nothing.
func (o *owner) Ended(w *core.Waiter, out core.Outcome) core.Ending {
	l := (*Limiter)(o)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case out == core.OutCanceled:
		l.stats.Canceled++
		return core.Ending{}
	case out == core.OutDeadline: // told as if it had timed out
		l.stats.Canceled++
		return core.Ending{Rej: l.eng.RejectLane(ErrWaitTimeout, "", &l.lane, w.Hold.Units(), w.Class)}
	case out == core.OutRefused: // counted by the SetLimit that refused it
		return core.Ending{Rej: l.eng.RejectLane(ErrExceedsLimit, "", &l.lane, w.Hold.Units(), w.Class)}
	case l.eng.FailOpen:
		l.stats.Bypassed++
		l.seq++
		w.Hold.ID = l.seq
		return core.Ending{Bypass: "limiter", Attrs: []slog.Attr{slog.Int("in_flight", l.lane.Holders.Units()),
			slog.Int("limit", l.lane.Limit), slog.Int("queued", l.lane.Waiters.Len())}}
	}
	l.stats.WaitTimeouts++
	return core.Ending{Rej: l.eng.RejectLane(ErrWaitTimeout, "", &l.lane, w.Hold.Units(), w.Class)}
}

// Withdraw implements core.Waits: it takes w out of the queue if it is
// still waiting.
func (o *owner) Withdraw(w *core.Waiter) bool {
	l := (*Limiter)(o)
	var wk core.Wakes
	l.mu.Lock()
	heavy := l.lane.Waiters.Heavy() > 0 // before w leaves: it may be the one
	ok := l.lane.Withdraw(w)
	if ok && (l.lane.Shares != nil || heavy) {
		// A class that stops waiting stops keeping its minimum share from
		// the others, which may now take it; a heavy waiter that leaves
		// stops keeping free units from the waiters after it, and beside
		// one a flow that leaves changes whose turn comes first.
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
	for w, passed := l.lane.Candidate(nil); w != nil; w, passed = l.lane.Candidate(nil) {
		l.lane.Serve(w)
		passed.Pass(w, int64(w.Hold.Extra)+1)
		if now == 0 {
			now = l.engine().Clock.Coarse()
		}
		w.Hold.At = now
		l.admitLocked(w.Hold)
		l.stats.Waited++
		wk.Grant(w)
	}
}

// owner is the Limiter as the core.Owner of its holds: a defined type, so
// that these methods stay off the Limiter's public method set.
type owner Limiter

func (l *Limiter) owner() *owner { return (*owner)(l) }

// Release implements core.Owner; called once per admitted hold.
func (o *owner) Release(h *core.Hold) bool {
	l := (*Limiter)(o)
	l.mu.Lock()
	if !l.lane.Remove(h, &h.Idx) {
		l.mu.Unlock()
		o.Misuse(h) // a copied Slot: it holds nothing
		return false
	}
	l.stats.Released++
	if l.lane.Waiters.Len() == 0 {
		l.mu.Unlock() // nobody to serve (BenchmarkLimiterTryAcquireRelease)
	} else {
		var wk core.Wakes
		l.grantLocked(&wk)
		l.mu.Unlock()
		wk.Wake()
	}
	l.engine().Released(h)
	return true
}

// Misuse implements core.Owner: a second Release of the same slot.
func (o *owner) Misuse(h *core.Hold) { (*Limiter)(o).engine().Misuse(h) }

// Time implements core.Owner.
func (o *owner) Time(at int64) time.Time { return (*Limiter)(o).engine().Clock.Time(at) }

// Log implements core.Owner.
func (o *owner) Log() *slog.Logger { return (*Limiter)(o).engine().Log() }

// Reclaim implements core.Leaker: a Slot was dropped while held.
func (o *owner) Reclaim(t *core.Tracked) { (*Limiter)(o).engine().Reclaim(t) }

// SetLimit changes the limit. Raising it admits waiters at once; lowering
// it takes nothing from holders. A negative n is ignored (and logged).
func (l *Limiter) SetLimit(n int) {
	if n < 0 {
		l.engine().Log().Warn("slots: SetLimit with a negative limit ignored", slog.Int("limit", n))
		return
	}
	var wk core.Wakes
	l.mu.Lock()
	l.lane.Limit = n
	for _, w := range l.lane.Overweight(nil) {
		l.lane.Waiters.Remove(&w.Elem)
		l.stats.ExceedsLimit++
		wk.Refuse(w)
	}
	l.grantLocked(&wk)
	l.mu.Unlock()
	wk.Wake()
}

// Limit returns the current limit.
func (l *Limiter) Limit() int { return l.Stats().Limit }

// InFlight returns the units held now (bypassed slots hold none).
func (l *Limiter) InFlight() int { return l.Stats().InFlight }

// Waiting returns the number of callers waiting in Acquire now.
func (l *Limiter) Waiting() int { return l.Stats().Waiting }

// Stats returns the counts.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	st := l.stats
	st.InFlight, st.Waiting, st.Limit = l.lane.Holders.Units(), l.lane.Waiters.Len(), l.lane.Limit
	l.mu.Unlock()
	st.DoubleReleases, st.Leaked = l.engine().Misuses(), l.engine().Leaks()
	return st
}

// Queue describes the callers waiting now.
func (l *Limiter) Queue() QueueStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return core.QueueStats[QueueStats, FlowStat](&l.lane.Waiters)
}

// Holder describes one live holder, for sweeps and debugging.
type Holder struct {
	ID         uint64
	AcquiredAt time.Time
	Units      int // the units it holds (see Slot.Units)
}

// Holders appends the live holders, in no order, to dst.
func (l *Limiter) Holders(dst []Holder) []Holder {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.lane.Holders.Len() {
		h := l.lane.Holders.At(i)
		dst = append(dst, Holder{ID: h.ID, AcquiredAt: l.engine().Clock.Time(h.At), Units: h.Units()})
	}
	return dst
}
