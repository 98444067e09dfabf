package gateway

// Budgets per minute (provider.tokens_per_minute and its parts,
// max_requests_per_minute; per model, key and org too): the answer's
// rate-limit headers, the budgets' series, and the reservations kept
// beside the Gate's (an org's; with a fleet, the provider's and models').

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep/inflightprom"
)

// budgetsTokens reports whether the provider's policy has a budget per
// minute anywhere (of tokens, or of requests).
func budgetsTokens(p pacing.Config) bool {
	none := pacing.BudgetLimits{}
	if p.BudgetLimits != none {
		return true
	}
	for _, k := range p.APIKeys {
		if k.BudgetLimits != none {
			return true
		}
	}
	for _, m := range p.Models {
		if m.BudgetLimits != none {
			return true
		}
	}
	return false
}

// registerBudgets exports the Gate's budgets (inflightprom.Budgets:
// caps "provider", "model:<name>", "api_key:<id>") and, with a fleet, its
// provider's and models' as the store's last answers to this gateway
// counted them (fleet.Budget.Status).
func (g *Gateway) registerBudgets() {
	g.metrics.MustRegister(inflightprom.NewBudgets(func() []inflightprom.Budget {
		var out []inflightprom.Budget
		if fb := g.fleetBudgets; fb != nil {
			each := func(c string, b *fleet.Budget) {
				if b == nil {
					return
				}
				st := b.Status()
				for i, l := range st.Limits {
					if l > 0 {
						out = append(out, inflightprom.Budget{Cap: c, Budget: pacing.BudgetCap(i), Left: st.Left[i], Limit: l})
					}
				}
			}
			each("provider", fb.provider)
			for name, b := range fb.models {
				each("model:"+name, b)
			}
		}
		return append(out, inflightprom.GateBudgets(g.gate)...)
	}))
}

// newOrgBudgets returns the orgs' budgets of cfg, each made when an org
// first needs its own and dropped once idle (org names come from a
// header: they must not pile up), nil when cfg sets none; and each org's
// limits (nil: none).
func newOrgBudgets(cfg OrgsConfig) (*pacing.Budgets[string], func(org string) *pacing.BudgetLimits) {
	limits := func(org string) *pacing.BudgetLimits {
		if l, ok := cfg.Budgets[org]; ok {
			return &l
		}
		return cfg.Budget
	}
	if cfg.Budget == nil && len(cfg.Budgets) == 0 {
		return nil, limits
	}
	return pacing.NewBudgets(limits), limits
}

// fleetBudgets are the budgets per minute a fleet of gateways shares in
// its store: the provider's and the models' (nil when unset), and the
// orgs', made per request (a fleet.Budget is a name and limits).
type fleetBudgets struct {
	provider     *fleet.Budget
	models       map[string]*fleet.Budget
	tenants      driver.Store
	closed       bool          // fleet.on_unavailable "closed": no request goes uncounted
	timeout      time.Duration // a budget call's, as the fleet's (fleet.timeout_ms)
	uncountedLog rejectLog     // the requests let through while a budget's store could not be reached
}

// spending is what a request reserved of the budgets the gateway keeps
// beside the Gate's: its org's (here, or in the fleet's store), reserved
// by the handler, and with a fleet its provider's and its model's,
// reserved by the provider's Transport before it takes a slot
// (reserveFleet). It is the Transport's pacing.FleetReservation, which
// starts, settles or cancels it; a later settle or cancel does nothing.
type spending struct {
	t     tenant
	local *pacing.Reservation
	fleet *fleet.Reservations // the org's, then the provider's and its model's
	down  func() bool         // the fleet's store held unavailable: its calls are skipped
}

// done ends the request's hold on its org's budget: an estimate not
// settled by then stands.
func (s *spending) done() { s.local.Close() }

// Settle corrects the reservations with what the request used.
func (s *spending) Settle(_ context.Context, used pacing.Tokens) error {
	s.local.Settle(used)
	s.each(func(ctx context.Context) error { return s.fleet.Settle(ctx, used) })
	return nil
}

// Cancel takes the reservations back whole, the request's too.
func (s *spending) Cancel(context.Context) error {
	s.local.Cancel()
	s.each(s.fleet.Cancel)
	return nil
}

// Left returns, per part, the least the fleet's budgets had left when the
// request was reserved, with their limits (fleet.Reservations.Left).
func (s *spending) Left() (left, limits [4]int) { return s.fleet.Left() }

// Start moves the request's charges to the second it starts in: its
// org's here (pacing.Reservation.Start), and the fleet's
// (fleet.Reservations.Start); it may have waited for the provider. It
// returns the refusal of a budget that a reservation has left (its request
// waited longer than the budget's minute) and that can no longer take it,
// named as at its reservation; the Transport then does not send it, and
// cancels the rest. After a store's error the request goes, and what it
// uses is charged as it settles.
func (s *spending) Start(context.Context) error {
	if err := s.local.Start(); err != nil {
		budgetCap("tenant", s.t, err)
		return err
	}
	var refused error
	s.each(func(ctx context.Context) error {
		var le *slots.LimitError
		if err := s.fleet.Start(ctx); errors.As(err, &le) {
			prefix := ""
			if strings.HasPrefix(le.Key, "model:") {
				prefix = "model"
			} else if strings.HasPrefix(le.Key, "org") {
				prefix = "tenant"
			}
			budgetCap(prefix, s.t, le)
			refused = le
		}
		return nil
	})
	return refused
}

// each sends a correction of the fleet's reservations, unless the store
// is held unavailable: the estimates stand then, as they do when a
// correction is lost. Each of its calls to the store is bounded by its
// Budget's timeout (one for them all ran out before the last budgets').
func (s *spending) each(f func(context.Context) error) {
	if len(s.fleet.Reserved()) == 0 || s.down != nil && s.down() {
		return
	}
	_ = f(context.Background())
}

// reserveBudgets reserves cost, for t's request, of its org's budget, here
// or with a fleet in its store. It returns what it reserved, or the
// refusal of the budget (nothing reserved then) with the cap to name: with
// a fleet, that of the provider's or the model's budget instead if it
// would take the request later than the org's (fleet.LaterRefusal). With
// a fleet whose store is held unavailable, fleet.on_unavailable "closed"
// refuses the request (503), and else lets it through uncounted (logged).
func (g *Gateway) reserveBudgets(ctx context.Context, t tenant, cost pacing.Tokens) (*spending, string, error) {
	s := &spending{t: t}
	if fb := g.fleetBudgets; fb != nil {
		if held, err := g.storeHeld(fb); held {
			if err != nil {
				return nil, pacing.CapProvider, err
			}
			return s, "", nil
		}
		s.down = g.caps.StoreUnavailable
		limits := g.orgLimits(t.Org)
		if limits == nil {
			return s, "", nil
		}
		orgs, err := fleet.NewBudget(fb.tenants, orgBudgetName(t.Org), *limits, fb.timeout)
		if err != nil {
			return nil, "tenant", err
		}
		rs, _, err := fleet.ReserveAll(ctx, cost, fb.uncounted(g), orgs)
		if err != nil {
			// Told when the provider's and the model's budgets, which its
			// Transport reserves, would take the request too: told the
			// org's time alone, it came back then to be refused by them.
			switch i, later := fleet.LaterRefusal(ctx, cost, err, fb.provider, fb.models[t.Model]); i {
			case -1:
				return nil, budgetCap("tenant", t, err), err
			case 0:
				return nil, budgetCap("", t, later), later
			default:
				return nil, budgetCap("model", t, later), later
			}
		}
		s.fleet = rs
		return s, "", nil
	}
	if g.orgBudgets == nil {
		return s, "", nil
	}
	var err error
	if s.local, err = g.orgBudgets.Reserve(t.Org, cost); err != nil {
		return nil, budgetCap("tenant", t, err), err
	}
	return s, "", nil
}

// reserveFleet is the provider's Transport's reservation of a request's
// budgets (pacing.WithFleetBudgets): its spending, with, with a fleet, its
// provider's and its model's budgets reserved too. A refusal there gives
// the org's reservation back; the Transport names the budget (the model's
// as model_...) and answers it as the provider's caps' refusals.
func (g *Gateway) reserveFleet(ctx context.Context, model string, cost pacing.Tokens) (pacing.FleetReservation, error) {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	if x == nil || x.spent == nil {
		return nil, nil
	}
	s, fb := x.spent, g.fleetBudgets
	if fb == nil || fb.provider == nil && fb.models[model] == nil {
		return s, nil
	}
	if held, err := g.storeHeld(fb); held {
		if err != nil {
			_ = s.Cancel(ctx)
			return nil, err
		}
		return s, nil
	}
	s.down = g.caps.StoreUnavailable
	rs, _, err := fleet.ReserveAll(ctx, cost, fb.uncounted(g), fb.provider, fb.models[model])
	if err != nil {
		_ = s.Cancel(ctx)
		return nil, err
	}
	s.fleet = s.fleet.Join(rs)
	return s, nil
}

// storeHeld reports whether the fleet's store is held unavailable (no
// call waits for it then), with the error that refuses the request if
// fleet.on_unavailable is "closed"; else the request goes uncounted
// (logged).
func (g *Gateway) storeHeld(fb *fleetBudgets) (bool, error) {
	err := g.caps.Unavailable("the budgets' store")
	if err == nil {
		return false, nil
	}
	if fb.closed {
		return true, err
	}
	g.uncounted(fb, err)
	return true, nil
}

// uncounted returns, unless fleet.on_unavailable is "closed", what
// fleet.ReserveAll tells of a budget whose store cannot be reached: the
// request goes on uncounted there, logged.
func (fb *fleetBudgets) uncounted(g *Gateway) func(int, error) {
	if fb.closed {
		return nil
	}
	return func(_ int, err error) { g.uncounted(fb, err) }
}

// uncounted logs, at most every 10 s, that requests go through uncounted
// for err.
func (g *Gateway) uncounted(fb *fleetBudgets, err error) {
	if ok, held := fb.uncountedLog.allow(time.Now()); ok {
		g.log.Warn("gateway: a budget's store cannot be reached: requests go through uncounted",
			slog.Any("error", err), slog.Int("suppressed_since_last", held))
	}
}

// orgBudgetName is the name of org's budget in the fleet's store: quoted,
// as the org caps' keys are (any bytes make a name), or, past what a
// name may hold, a hash of it.
func orgBudgetName(org string) string {
	if name := "org:" + strconv.Quote(org); len(name) <= 512 {
		return name
	}
	sum := sha256.Sum256([]byte(org))
	return "org#" + hex.EncodeToString(sum[:])
}

// budgetCap names the budget that refused t's request with err, after
// prefix ("" for the provider's own): "tenant_tokens_per_minute", say.
func budgetCap(prefix string, t tenant, err error) string {
	var le *slots.LimitError
	if !errors.As(err, &le) {
		return cmp.Or(prefix, pacing.CapProvider)
	}
	if prefix == "tenant" {
		le.Key = t.String() // the provider's name no tenant
	}
	if prefix != "" {
		le.Cap = prefix + "_" + le.Cap
	}
	return le.Cap
}
