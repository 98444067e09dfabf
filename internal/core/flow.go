package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"
)

// The admission flow, written once. Every owner's Acquire is three steps:
//
//	x, h, t := e.Begin(owner, n, skip) // the Slot to be and the hold it takes
//	// lock; d := the owner's Decision (Ended first); unlock; wake
//	x, err := e.Finish(ctx, x, t, d)   // hand out, refuse, or wait and end
//
// The owner decides under its own lock whether the caller is admitted now,
// refused now, or queued (and on what: its Waits); Finish does everything
// after, the same way for every owner: the events, the wait, and each way a
// wait ends (granted, canceled, refused, timed out, fail-open).

// Decision is an owner's answer for one caller, made under its lock. The
// zero Decision is none: Finish panics on it.
type Decision struct {
	how  uint8
	rej  *Rejection // refused
	fail *Ending    // failed
	w    *Waiter    // waits: the caller, with its Waits
}

const (
	undecided uint8 = iota
	admitted
	canceled
	refused
	failed
	waits
)

// Admit is the Decision that the caller is admitted: its hold has been
// counted.
func Admit() Decision { return Decision{how: admitted} }

// Cancel is the Decision for a caller whose context had ended (Ended,
// asked under the lock before anything else).
func Cancel() Decision { return Decision{how: canceled} }

// Refuse is the Decision to turn the caller away now with rej (counted by
// the owner).
func Refuse(rej *Rejection) Decision { return Decision{how: refused, rej: rej} }

// Fail is the Decision to turn the caller away now with err, an error of
// the owner's that is no rejection (a Gate closed), reported as reason.
func Fail(reason, err error) Decision {
	return Decision{how: failed, fail: &Ending{Reason: reason, Err: err}}
}

// Wait is the Decision that the caller waits as w, which the owner has
// queued (and may have granted at once): ends says how its wait ends.
func Wait(w *Waiter, ends Waits) Decision {
	w.ends = ends
	return Decision{how: waits, w: w}
}

// Waits is the owner's side of one caller's wait: the owner's record of
// what it waits on. Its methods take the owner's locks.
type Waits interface {
	// Withdraw unlinks w if it is still Waiting, marks it Gone and reports
	// true; it reports false when w was granted already. It serves what
	// w's leaving unblocks.
	Withdraw(w *Waiter) bool
	// Ended counts a wait that took nothing (out is OutCanceled,
	// OutDeadline, OutRefused or OutExpired) and says how to answer it;
	// not called for a grant given back (Hold.GivenBack), which its
	// release counted. For OutDeadline, its Rej is what the caller would
	// have been told had its wait timed out instead: its RetryAfter goes
	// with the context's error.
	Ended(w *Waiter, out Outcome) Ending
}

// Ending is how a wait that took nothing is answered (Waits.Ended): with
// Rej; else with Err, an error of the owner's (a Gate closed meanwhile),
// reported as Reason (nil: Err); else, after a timeout, by fail-open when
// Bypass names what was saturated ("limiter", "key", "provider"), once the
// owner has counted the bypass and numbered the hold, with Attrs for the
// log; else with the context's error.
type Ending struct {
	Rej    *Rejection
	Reason error
	Err    error
	Bypass string
	Attrs  []slog.Attr
}

// Begin returns the Slot to be for owner (nil: set by the owner before it
// counts the hold) of a caller weighing n units, 1 <= n <= MaxUnits, and
// the hold to count for it, started now on the coarse clock; with leak
// detection, the tracked hold apart from it (see Tracked), which Finish
// attaches. skip is the number of frames between Begin's caller and the
// user's code (0 when the caller is what the user called), for leak sites.
func (e *Engine) Begin(owner Owner, n, skip int) (x *Handle, h *Hold, t *Tracked) {
	x = new(Handle)
	if e.LeakCheck {
		t = &Tracked{Hold: Hold{Owner: owner}}
		h = &t.Hold
		if e.LeakSites {
			t.recordSite(skip + 2) // above Begin, its caller and skip more
		}
	} else {
		x.h.Owner = owner
		h = &x.h
	}
	h.At = e.Clock.Coarse()
	h.Extra = int32(n - 1) // its Units
	return x, h, t
}

// Check returns the error, reported as a rejection under ctx, for a weight
// n outside 1..MaxUnits (see CheckUnits), or else for a nil ctx of a call
// that waits (ErrNilContext); or nil.
func (e *Engine) Check(ctx context.Context, n int, waits bool) error {
	if err := CheckUnits(n); err != nil {
		e.Rejected(ctx, ErrBadUnits, 0)
		return err
	}
	if waits && ctx == nil {
		e.Rejected(nil, ErrNilContext, 0)
		return ErrNilContext
	}
	return nil
}

// Finish ends the admission of x (with t, its tracked hold, or nil) as the
// owner decided in d, under ctx (nil: a call that does not wait): it
// hands the Slot out, or refuses, or waits and ends the wait. A caller
// whose context ends never leaves with capacity.
func (e *Engine) Finish(ctx context.Context, x *Handle, t *Tracked, d Decision) (*Handle, error) {
	if d.how == admitted && t == nil && e.Observer == nil {
		return x, nil // the common admission, without a call
	}
	return e.finish(ctx, x, t, d)
}

func (e *Engine) finish(ctx context.Context, x *Handle, t *Tracked, d Decision) (*Handle, error) {
	var end Ending
	var waited time.Duration
	switch d.how {
	case undecided:
		panic("core: no decision")
	case admitted:
		return e.acquired(ctx, x, t, 0), nil
	case refused:
		end.Rej = d.rej
	case failed:
		end = *d.fail
	case waits:
		w := d.w
		var expire <-chan time.Time
		stop := func() bool { return false }
		if w.MaxWait > 0 {
			expire, stop = e.Clock.Timer(w.MaxWait)
		}
		out := Await(ctx, w, expire, w.ends.Withdraw)
		stop()
		// w.Start, not w.Hold.At: a grant overwrites that. Never
		// negative, should an injected clock be set back.
		if out == OutGranted {
			return e.acquired(ctx, x, t, time.Duration(max(e.Clock.WaitEnd(w.Hold.At)-w.Start, 0))), nil
		}
		if out == OutCanceled && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			out = OutDeadline
		}
		if !w.Hold.GivenBack { // else its owner counted a grant and its release
			end = w.ends.Ended(w, out)
		}
		waited = time.Duration(max(e.Clock.Nanos()-w.Start, 0))
		if out == OutDeadline {
			err := e.Canceled(ctx, waited)
			if end.Rej != nil {
				err = RetryLater(err, end.Rej.RetryAfter)
			}
			return nil, err
		}
		if out == OutExpired && end.Rej == nil && end.Err == nil && end.Bypass != "" {
			e.bypass(ctx, w, end.Bypass, end.Attrs...)
			e.handOut(x, t)
			return x, nil
		}
	}
	switch {
	case end.Rej != nil:
		e.Rejected(ctx, end.Rej.Err, waited)
		return nil, e.asError(end.Rej)
	case end.Err != nil:
		e.Rejected(ctx, cmp.Or(end.Reason, end.Err), waited)
		return nil, end.Err
	}
	return nil, e.Canceled(ctx, waited)
}

// acquired hands out an admitted Slot and reports it after waiting wait,
// under ctx (nil: an admission without a context). If the Observer (or
// its Wants) panics the Slot is released, since it never reaches its
// caller, and the panic goes on up.
func (e *Engine) acquired(ctx context.Context, x *Handle, t *Tracked, wait time.Duration) *Handle {
	e.handOut(x, t)
	if e.Observer != nil {
		ok := false
		defer func() {
			if !ok {
				x.h.Release()
				runtime.KeepAlive(x) // see Tracked
			}
		}()
		if e.Wants == nil || e.Wants(ctx) {
			e.Observer(Event{Kind: EventAcquired, Wait: wait, Ctx: ctx, Units: x.h.Units()})
		}
		ok = true
	}
	return x
}

// handOut finishes an admission without reporting it (a bypass): with leak
// detection, x becomes the stand-in of its tracked hold t.
func (e *Engine) handOut(x *Handle, t *Tracked) {
	if t != nil {
		AttachTo(t, x, &x.h)
	}
}

// bypass admits w's hold by fail-open once its wait timed out: it holds no
// capacity. The saturation of what ("limiter", "key", "provider") is
// logged at most once every 10 seconds, with attrs, and reported. Call
// after the owner has counted the bypass (and numbered the hold, if it
// numbers bypasses).
func (e *Engine) bypass(ctx context.Context, w *Waiter, what string, attrs ...slog.Attr) {
	h, start, maxWait := w.Hold, w.Start, w.MaxWait
	h.Bypassed = true
	h.Owner = &bypassed{Owner: h.Owner, hold: h}
	h.At = e.Clock.Nanos() // exact: start may be an exact reading too
	if e.satLog.Allow(h.At, saturationLogEvery) {
		if h.ID != 0 {
			attrs = append(attrs, slog.Uint64("slot_id", h.ID))
		}
		attrs = append(attrs, slog.Duration("max_wait", maxWait))
		e.Log().LogAttrs(context.Background(), slog.LevelWarn,
			e.name+": "+what+" saturated; admitting without a slot (fail-open)", attrs...)
	}
	e.Emit(Event{Kind: EventBypassed, Wait: time.Duration(max(h.At-start, 0)), Ctx: ctx, Units: h.Units()})
}

// RetryLater returns err, the context's error of a caller whose deadline
// passed while it waited, with when its turn was expected: RetryAfter,
// which slots.HTTPStatus answers 503 with.
func RetryLater(err error, after time.Duration) error { return &deadlineError{err, after} }

type deadlineError struct {
	error
	after time.Duration
}

func (e *deadlineError) Unwrap() error { return e.error }

func (e *deadlineError) RetryAfter() time.Duration { return e.after }

// Canceled reports a caller whose context ended before it was admitted,
// after waiting wait, and returns its error. Call without locks.
func (e *Engine) Canceled(ctx context.Context, wait time.Duration) error {
	e.Rejected(ctx, ctx.Err(), wait)
	return fmt.Errorf("%s: acquire: %w", e.name, ctx.Err())
}
