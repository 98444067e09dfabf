package pacing

// The budgets per minute a Transport reserves outside its Gate: kept
// here (WithBudgets), and a fleet's, kept in its store (WithFleetBudgets).

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/inflight-go/inflight/slots"
)

// FleetReservation is what one request reserved of budgets per minute kept
// outside the Gate, as WithFleetBudgets makes it: a *fleet.Reservations
// (the fleet's budgets, in its store), or the caller's own (a Budget's
// Reservation needs none: WithBudgets). The Transport calls its methods
// from one goroutine at a time, Start at most once, and then at most one
// of Settle and Cancel; a request whose end tells nothing (a failed
// exchange, an answer without usage) calls neither, and its estimate
// stands. Each is called on the path of the request (Settle as its
// answer's body ends), so each should bound its own wait (a fleet.Budget's
// calls time out).
type FleetReservation interface {
	// Start is called once the request has its slots, as it is about to
	// be sent: a budget that counts a request when it starts moves its
	// charge there. A *slots.LimitError refuses the request: it is not
	// sent, and Cancel is called; any other error lets it go.
	Start(ctx context.Context) error
	// Settle corrects the reservation with what the request used (the
	// usage its answer reported), or, for a redirect or another 4xx, with
	// none: it was sent, and counts as a request.
	Settle(ctx context.Context, used Tokens) error
	// Cancel takes the reservation back whole: the request charges
	// nothing (refused by the Gate, the fleet, a budget or the upstream,
	// or never sent).
	Cancel(ctx context.Context) error
}

// FleetBudgetsLeft is a FleetReservation that can say what its budgets
// had left, per part as BudgetCap names them, with their limits (0:
// none): with WithRateLimitHeaders, an answer's headers count them
// beside the Gate's budgets (a *fleet.Reservations is one).
type FleetBudgetsLeft interface {
	Left() (left, limits [budgetParts]int)
}

// WithFleetBudgets makes each request reserve its estimate of budgets per
// minute kept outside the Gate with reserve, called with the request's
// model and its cost (WithTokens; none for a request without, which
// counts one request): first, before it takes the fleet's caps and waits
// for the Gate. An error refuses the request there, with nothing held
// (reserve gives back whatever it took: a FleetReservation returned with
// an error is not used); a *slots.LimitError whose Key starts with
// "model:" has its Cap named as the Gate names its model's budgets
// ("model_" before it). What it reserved is started, settled or
// cancelled as FleetReservation says: a request refused later, or not
// sent, charges nothing (but a bypass's estimate in the Gate's budgets,
// as Transport says). A nil FleetReservation with a nil error reserves
// nothing. With a fleet's Budgets (each gateway's fleet.Budget of the
// same name counts in one store):
//
//	pacing.WithFleetBudgets(func(ctx context.Context, model string, cost pacing.Tokens) (pacing.FleetReservation, error) {
//		rs, _, err := fleet.ReserveAll(ctx, cost, nil, provider, models[model])
//		return rs, err
//	})
func WithFleetBudgets(reserve func(ctx context.Context, model string, cost Tokens) (FleetReservation, error)) TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.reserve = reserve })
}

// WithBudgets makes each request (but one under slots.WithoutSlot, which
// takes nothing) reserve its estimate of budgets per minute kept in this
// process beside the Gate's (a tenant's: a Budget, or a key's of Budgets)
// with reserve, called with the request's model and its cost (WithTokens;
// none for a request without, which counts one request): first, before
// WithFleetBudgets' reservation, the fleet's caps and the Gate. An error
// refuses the request there, with nothing held (a Reservation returned
// with an error is not used: reserve ends it); a nil Reservation reserves
// nothing. The Transport starts the reservation as its request is sent
// (one whose Start is refused is not sent, and the Transport returns that
// *slots.LimitError), settles it with the usage its answer reports (under
// WithTokens), cancels it when the request is refused (here or by the
// upstream) or not sent, and closes it once the request's slots are free:
// an estimate its answer did not settle stands, and Budgets may drop the
// key's Budget once idle. With Budgets per tenant:
//
//	tenants := pacing.NewBudgets(limitsOf)
//	pacing.WithBudgets(func(ctx context.Context, _ string, cost pacing.Tokens) (*pacing.Reservation, error) {
//		return tenants.Reserve(tenantOf(ctx), cost)
//	})
func WithBudgets(reserve func(ctx context.Context, model string, cost Tokens) (*Reservation, error)) TransportOption {
	return transportOptionFunc(func(c *transportConfig) { c.t.reserveHere = reserve })
}

// reserveBudgets reserves x's request's cost of the budgets kept beside
// the Gate: here, then the fleet's. On an error admit ends what it
// reserved (endBudgets).
func (t *Transport) reserveBudgets(ctx context.Context, x *exchange) error {
	cost, _ := tokensOf(ctx)
	if t.reserveHere != nil {
		r, err := t.reserveHere(ctx, x.model, cost)
		if err != nil {
			return err
		}
		x.here = r
	}
	if t.reserve == nil {
		return nil
	}
	r, err := t.reserve(ctx, x.model, cost)
	if err != nil {
		return nameBudget(err)
	}
	x.spend = r
	return nil
}

// startBudgets starts what x reserved, as its request is about to be
// sent: the refusal of a budget that can no longer take it, if any. A
// refusal, or a panic in Start, gives x's grant back to the Gate first
// (not sent: it charges the Gate's budgets and spacing nothing); the
// caller releases it.
func (t *Transport) startBudgets(ctx context.Context, x *exchange) error {
	if x.spend == nil && x.here == nil {
		return nil
	}
	sent := false
	defer func() {
		if !sent {
			t.gate.unsent(x.grant)
		}
	}()
	if err := x.here.Start(); err != nil {
		return err
	}
	var le *slots.LimitError
	if x.spend != nil {
		if err := x.spend.Start(context.WithoutCancel(ctx)); errors.As(err, &le) {
			return nameBudget(err)
		}
	}
	sent = true
	return nil
}

// endBudgets settles what x reserved with st (Served: with its usage), or
// cancels it, once: a later call does nothing.
func endBudgets(x *exchange, st Settlement) {
	if x.spend == nil && x.here == nil || !x.spendEnded.CompareAndSwap(false, true) {
		return
	}
	if st.Served {
		x.here.Settle(st.Used)
	} else {
		x.here.Cancel()
	}
	if x.spend == nil {
		return
	}
	ctx := context.WithoutCancel(x.parent)
	if st.Served {
		_ = x.spend.Settle(ctx, st.Used)
	} else {
		_ = x.spend.Cancel(ctx)
	}
}

// budgetsLeft returns what x's reservation had left, as a Gate's Budgets
// tells its own (no reset time).
func budgetsLeft(x *exchange) []BudgetStatus {
	bl, ok := x.spend.(FleetBudgetsLeft)
	if !ok {
		return nil
	}
	left, limits := bl.Left()
	var st []BudgetStatus
	for i, l := range limits {
		if l > 0 {
			st = append(st, BudgetStatus{Cap: BudgetCap(i), Limit: l, Left: left[i]})
		}
	}
	return st
}

// nameBudget names the Cap of a model's budget's refusal err as the Gate
// names its own, "model_" before it, on a copy (see nameFleetCap): a
// refusal whose Key starts with "model:" and whose Cap is a budget's part
// as BudgetCap names it, not one named already.
func nameBudget(err error) error {
	var le *slots.LimitError
	if !errors.As(err, &le) || !strings.HasPrefix(le.Key, "model:") || !slices.ContainsFunc(budgetCaps[:], func(c string) bool { return c == le.Cap }) {
		return err // not a model's, or named already (a tenant's, say)
	}
	named := *le
	named.Cap = "model_" + le.Cap
	if err == error(le) {
		return &named
	}
	return namedRefusal{err: err, named: &named}
}
