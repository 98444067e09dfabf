package fleet

import (
	"context"
	"errors"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
)

// BudgetReservation is what a request took of a fleet's Budget: settle it
// with what the request used, or cancel it.
type BudgetReservation struct {
	b       *Budget
	cost    [upstream.BudgetParts]int64
	charged [2]bool  // per record: charged by Reserve
	step    [2]int64 // per record: the step charged
	used    [upstream.BudgetParts]int64
	done    bool
	// gone, per record: Start found its charge out of the window and the
	// budget, spent by others, refused it again: nothing is charged there.
	gone [2]bool
	// debt, per record: Start found its charge out of the window and could
	// not charge it again for the store's error: Settle charges what the
	// request used there as a debt, Cancel nothing.
	debt [2]bool
	// refused is Start's refusal (gone), returned again if Start is.
	refused error
}

// Left returns, per part (all, input, output, requests), what the budget
// had left in its last minute once this reservation was charged, and its
// limits (0: none).
func (r *BudgetReservation) Left() (left, limits [upstream.BudgetParts]int) {
	for i := range left {
		left[i], limits[i] = int(r.b.limits[i]-r.used[i]), int(r.b.limits[i])
	}
	return left, limits
}

// Start moves the reservation's charges to the second its request starts
// in, for a request that may have waited (in a queue) since Reserve: the
// budget counts a request when it starts, as the upstream does. It is one
// atomic store call per record; if one fails, its charge stays where it
// was, or was moved with its reply lost: Settle then returns what the
// request did not use to the second it was reserved in, which no longer
// holds it, and the budget counts that part for the rest of the minute
// (no second counts below zero). Call it before Settle, from the goroutine
// that settles.
//
// A charge that has left the budget's minute meanwhile (its request waited
// longer than that) is charged again in the current second only if it
// fits, as Reserve charges (two more calls): if it does not, Start returns
// a *slots.LimitError wrapping ErrOverBudget (with a RetryAfter), again if
// called again, and the request must not start; Cancel it. If the store
// fails then, Start returns its error, and Settle charges what the request
// used as a debt. (A store that lost the charge's second otherwise, as in
// a restart without its data, is not seen: the move charges the current
// second unchecked.)
func (r *BudgetReservation) Start(ctx context.Context) error {
	if r == nil || r.done {
		return nil
	}
	if r.refused != nil {
		return r.refused
	}
	var errs []error
	// When both records refuse the charge again, the later binds: its
	// request is told to come back when both take it.
	refusedBy, refusal := -1, driver.BudgetResult{}
	for rec, charged := range r.charged {
		if !charged || r.gone[rec] || r.debt[rec] {
			continue
		}
		c := r.b.callOf(rec, r.cost)
		c.Correct, c.Move, c.Step = true, true, r.step[rec]
		res, err := r.b.call(ctx, rec, c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if res.Step-r.step[rec] > driver.BudgetSteps {
			// The charge had left the window: the move charged the
			// current second without a check. It goes back, and is
			// charged again if it fits.
			var again driver.BudgetResult
			again, err = r.charge(ctx, rec, res.Step)
			if err == nil && !again.Charged && (refusedBy < 0 || again.At-again.Now > refusal.At-refusal.Now) {
				refusedBy, refusal = rec, again
			}
		} else {
			r.step[rec] = res.Step
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if refusedBy >= 0 {
		r.refused = r.b.refusal(refusedBy, refusal, r.cost)
		errs = append([]error{r.refused}, errs...)
	}
	return errors.Join(errs...)
}

// charge takes back the charge that Start's move put in step st without a
// check, and charges it again if it fits. It returns the store's answer
// (not Charged: refused, nothing charged there), or its error: after the
// first call's, the charge stands in st; after the second's, what the
// request uses is charged as a debt (Settle).
func (r *BudgetReservation) charge(ctx context.Context, rec int, st int64) (driver.BudgetResult, error) {
	if err := r.b.takeBack(ctx, rec, r.cost, st); err != nil {
		r.step[rec] = st
		return driver.BudgetResult{}, err
	}
	res, err := r.b.chargeCall(ctx, rec, r.b.callOf(rec, r.cost))
	switch {
	case err != nil: // nothing charged, as far as this process knows
		r.debt[rec] = true
	case !res.Charged:
		r.gone[rec] = true
	default:
		r.step[rec] = res.Step
	}
	return res, err
}

// Settle corrects the reservation with what the request used: an
// overestimate is returned, an underestimate charged as debt; its request
// stays counted. Only the first Settle or Cancel counts (call them from
// one goroutine); a nil reservation does nothing. It returns the store's
// error, after which the estimate stands.
func (r *BudgetReservation) Settle(ctx context.Context, used upstream.Tokens) error {
	used.Input, used.Output = min(max(used.Input, 0), slots.MaxUnits), min(max(used.Output, 0), slots.MaxUnits)
	return r.correct(ctx, upstream.Charge(used))
}

// Cancel returns the whole reservation, its request too: the request was
// refused, or never sent.
func (r *BudgetReservation) Cancel(ctx context.Context) error {
	return r.correct(ctx, [upstream.BudgetParts]int64{})
}

func (r *BudgetReservation) correct(ctx context.Context, used [upstream.BudgetParts]int64) error {
	if r == nil || r.done {
		return nil
	}
	r.done = true
	var d [upstream.BudgetParts]int64
	for i := range d {
		d[i] = used[i] - r.cost[i]
	}
	var errs []error
	for rec, charged := range r.charged {
		if r.gone[rec] {
			continue // nothing charged there
		}
		if r.debt[rec] { // its estimate is not in the store: what it used is a debt
			c := r.b.callOf(rec, used)
			if c.Cost == [3]int64{} {
				continue // cancelled: nothing used
			}
			c.Correct, c.Step = true, -1
			if _, err := r.b.call(ctx, rec, c); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		c := r.b.callOf(rec, d)
		step := r.step[rec]
		if !charged && rec == tokensRecord && r.b.uses(rec) && [3]int64(r.cost[:3]) == [3]int64{} {
			// A request whose tokens nobody counted charged none: what it
			// used is charged now, in the second its request was counted
			// (pacing.Budget does so). One with tokens that were not
			// charged (refused, or the store's error) has nothing to
			// correct there.
			charged, step = true, r.step[requestsRecord]
			if !r.charged[requestsRecord] {
				step = -1 // no second: the current one, as a debt
			}
		}
		if !charged || c.Cost == [3]int64{} {
			continue
		}
		c.Correct, c.Step = true, step
		if _, err := r.b.call(ctx, rec, c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
