package fleet

import (
	"context"
	"errors"
	"time"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/slots"
)

// Reservations are what one request reserved of several fleet Budgets at
// once (ReserveAll): its provider's, its model's and its tenant's, say.
// They start, settle and cancel together; call their methods from one
// goroutine at a time. A nil *Reservations holds nothing and does
// nothing.
type Reservations struct {
	rs []*BudgetReservation
}

// ReserveAll reserves t, a request's estimated cost, of each of budgets
// in turn (a nil one is skipped), all or nothing: at the first that
// refuses, it stops, cancels the reservations made (each under its
// Budget's timeout and a context of its own; a cancel that fails leaves
// that estimate standing) and returns the index of the Budget that
// refused, among the arguments, with its error: a *slots.LimitError
// wrapping pacing.ErrOverBudget, t's own error (see Budget.Reserve), the
// context's, or the store's. A refusal over budget asks the Budgets after
// it when they would take the request (a check of each of their records,
// which charges nothing; one that fails is left out), and returns the
// refusal, and the index, of the one that would take it last: the request
// is told to come back when each of them takes it. (Told the first
// refusal's time alone, it came back when that Budget took it, and a
// later one refused it again.) A Budget whose store cannot be reached
// refuses so too, with an error wrapping ErrUnavailable, unless uncounted
// is not nil: uncounted is then told of it (its index and the error), and
// the request goes on, uncounted in that Budget (a later Budget may
// still refuse it). On success the index is -1. A panic in uncounted
// cancels the reservations made, as a refusal does.
func ReserveAll(ctx context.Context, t upstream.Tokens, uncounted func(i int, err error), budgets ...*Budget) (*Reservations, int, error) {
	if ctx == nil {
		ctx = context.Background() // as Budget's calls take it
	}
	rs := &Reservations{}
	taken := false
	defer func() { // after a refusal, or a panic in uncounted
		if !taken {
			rs.cancelMade(ctx)
		}
	}()
	for i, b := range budgets {
		if b == nil {
			continue
		}
		r, err := b.Reserve(ctx, t)
		switch {
		case err == nil:
			rs.rs = append(rs.rs, r)
		case uncounted != nil && errors.Is(err, ErrUnavailable):
			uncounted(i, err)
		default:
			rs.cancelMade(ctx) // first: the checks count none of this request's charges
			rs.rs = nil
			i, err = laterRefusal(ctx, t, budgets, i, err)
			return nil, i, err
		}
	}
	taken = true
	return rs, -1, nil
}

// laterRefusal returns err, budgets[i]'s refusal of a request of t, with
// i, or the refusal of a Budget after it that would take the request later
// still, with its index (see ReserveAll). The Budgets before i took the
// request now: they need no check.
func laterRefusal(ctx context.Context, t upstream.Tokens, budgets []*Budget, i int, err error) (int, error) {
	if j, later := LaterRefusal(ctx, t, err, budgets[i+1:]...); j >= 0 {
		return i + 1 + j, later
	}
	return i, err
}

// LaterRefusal returns the refusal of a request of t by the one of budgets
// that would take it last, with its index among them, if err, a Budget's
// refusal of that request over budget (as Reserve returns it), tells a
// time sooner than that Budget's; else err, with -1. Each Budget is asked
// with a check of its records, which charges nothing; one that fails, or
// a nil one, is left out. It is ReserveAll's rule for a caller that
// reserves its Budgets in steps (a tenant's as a request comes in, its
// provider's once it is routed, say): a request refused by the first is
// told to come back when the others would take it too.
func LaterRefusal(ctx context.Context, t upstream.Tokens, err error, budgets ...*Budget) (int, error) {
	var le *slots.LimitError
	if !errors.As(err, &le) || !errors.Is(err, upstream.ErrOverBudget) {
		return -1, err
	}
	if ctx == nil {
		ctx = context.Background() // as Budget's calls take it
	}
	i := -1
	for j, b := range budgets {
		if b == nil {
			continue
		}
		if rec, res := b.whenTaken(ctx, t); rec >= 0 && time.Duration(res.At-res.Now)*time.Millisecond > le.RetryAfter {
			le = b.refusal(rec, res, upstream.Charge(t)) // spread, as Reserve's refusal
			i, err = j, le
		}
	}
	return i, err
}

// cancelMade cancels the reservations made, each under its Budget's
// timeout, whether or not ctx has ended.
func (rs *Reservations) cancelMade(ctx context.Context) {
	for _, r := range rs.rs {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.b.timeout)
		_ = r.Cancel(cctx) // a charge that stays is an estimate that stands
		cancel()
	}
}

// Reserved returns the reservations made, in the order of their Budgets
// (BudgetReservation.Left tells what each Budget had left).
func (rs *Reservations) Reserved() []*BudgetReservation {
	if rs == nil {
		return nil
	}
	return rs.rs
}

// Join returns rs with more's reservations after its own (either may be
// nil): what a request reserved in two steps, to start, settle and cancel
// together.
func (rs *Reservations) Join(more *Reservations) *Reservations {
	if rs == nil {
		return more
	}
	rs.rs = append(rs.rs, more.Reserved()...)
	return rs
}

// Left returns, per part (all tokens, input, output, requests), the
// least that the reservations' Budgets limiting it had left once they
// were charged, with that Budget's limit (0: none limits it). A
// pacing.Transport tells it in an answer's rate-limit headers
// (pacing.WithFleetBudgets, pacing.WithRateLimitHeaders).
func (rs *Reservations) Left() (left, limits [upstream.BudgetParts]int) {
	for _, r := range rs.Reserved() {
		l, lim := r.Left()
		for i := range lim {
			if lim[i] > 0 && (limits[i] == 0 || l[i] < left[i]) {
				left[i], limits[i] = l[i], lim[i]
			}
		}
	}
	return left, limits
}

// Start moves each reservation's charges to the second its request
// starts in (BudgetReservation.Start); a charge that has left its
// budget's minute is charged again only if it fits, else Start returns
// the budget's refusal, and the request must not start: Cancel them.
// Refused by several budgets, it returns first the refusal that tells the
// latest time (the one errors.As finds): the request is told to come back
// when each of them takes it.
func (rs *Reservations) Start(ctx context.Context) error {
	var errs []error
	latest := -1
	var after time.Duration
	for _, r := range rs.Reserved() {
		err := r.Start(ctx)
		if err == nil {
			continue
		}
		var le *slots.LimitError
		if errors.As(r.refused, &le) && (latest < 0 || le.RetryAfter > after) {
			latest, after = len(errs), le.RetryAfter
		}
		errs = append(errs, err)
	}
	if latest > 0 {
		errs[0], errs[latest] = errs[latest], errs[0]
	}
	return errors.Join(errs...)
}

// Settle corrects each reservation with what the request used
// (BudgetReservation.Settle).
func (rs *Reservations) Settle(ctx context.Context, used upstream.Tokens) error {
	return rs.each(func(r *BudgetReservation) error { return r.Settle(ctx, used) })
}

// Cancel returns each reservation whole, its request too
// (BudgetReservation.Cancel).
func (rs *Reservations) Cancel(ctx context.Context) error {
	return rs.each(func(r *BudgetReservation) error { return r.Cancel(ctx) })
}

// each calls f on every reservation, and returns their errors joined: a
// call that failed leaves its Budget's estimate as it stood, and the
// others are made all the same.
func (rs *Reservations) each(f func(*BudgetReservation) error) error {
	var errs []error
	for _, r := range rs.Reserved() {
		if err := f(r); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
