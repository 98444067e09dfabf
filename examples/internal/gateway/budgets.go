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
	"fmt"
	"log/slog"
	"net/http"
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

// budgetAnswer adds, with a fleet, the rate-limit headers of the fleet's
// budgets (what they had left when the request was reserved) and of the
// Gate's own (its API keys'), unless the upstream refused with its own;
// without one they are the Transport's (pacing.WithRateLimitHeaders).
func (g *Gateway) budgetAnswer(resp *http.Response) {
	x, _ := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	if g.fleetBudgets == nil || x == nil || x.spent == nil {
		return
	}
	var key string
	if x.admitted != nil {
		key = x.admitted.Grant.Key
	}
	pacing.SetAnswerRateLimitHeaders(resp, append(x.spent.fleetLeft(), g.gate.Budgets()...), x.model, key)
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
// beside the Gate's: its org's (here or in the fleet's store) and, with a
// fleet, the provider's and its model's. Its settle and cancel are called
// from one goroutine at a time; the first ends its reservations, a later
// one does nothing (budgetStart cancels a request it does not send, which
// its Trace then settles as not served).
type spending struct {
	local   *pacing.Reservation
	fleet   *fleet.Reservations
	down    func() bool   // the fleet's store held unavailable: its calls are skipped
	timeout time.Duration // bounds each correction sent to the store
}

// done ends the request's hold on its org's budget: an estimate not
// settled by then stands.
func (s *spending) done() { s.local.Close() }

// settle corrects the reservations with what the request used; one the
// upstream refused (not Served) takes them back whole, its request too.
func (s *spending) settle(st pacing.Settlement) {
	if !st.Served {
		s.cancel()
		return
	}
	s.local.Settle(st.Used)
	s.each(func(ctx context.Context) error { return s.fleet.Settle(ctx, st.Used) })
}

// fleetLeft returns what the fleet's budgets had left when the request was
// reserved, as a Gate's Budgets tells it (no reset time: the store's
// reply does not carry it).
func (s *spending) fleetLeft() []pacing.BudgetStatus {
	var st []pacing.BudgetStatus
	for _, r := range s.fleet.Reserved() {
		left, limits := r.Left()
		for i, l := range limits {
			if l > 0 {
				st = append(st, pacing.BudgetStatus{Cap: pacing.BudgetCap(i), Limit: l, Left: left[i]})
			}
		}
	}
	return st
}

// start moves the fleet's charges to the second the request starts in
// (fleet.Reservations.Start): it may have waited for the provider. It
// returns the refusal of a budget that a reservation has left (its request
// waited longer than the budget's minute) and that can no longer take it;
// after a store's error the request goes, and what it uses is charged as
// it settles.
func (s *spending) start() error {
	var refused error
	s.each(func(ctx context.Context) error {
		var le *slots.LimitError
		if err := s.fleet.Start(ctx); errors.As(err, &le) {
			refused = le
		}
		return nil
	})
	return refused
}

// budgetStart is the provider's RoundTripper under its caps: it starts
// each admitted request's fleet budgets (spending.start) as the request
// is sent, and does not send one whose budgets refuse it then: it is
// answered as a refusal, with its Retry-After, and charges nothing.
type budgetStart struct{ next http.RoundTripper }

func (t budgetStart) RoundTrip(req *http.Request) (*http.Response, error) {
	if x, _ := req.Context().Value(exchangeKey{}).(*exchange); x != nil && x.spent != nil {
		if err := x.spent.start(); err != nil {
			x.spent.cancel()
			// Named as at its reservation: the budget's key says whose.
			var le *slots.LimitError
			prefix := ""
			if errors.As(err, &le) && strings.HasPrefix(le.Key, "model:") {
				prefix = "model"
			} else if le != nil && strings.HasPrefix(le.Key, "org") {
				prefix = "tenant"
			}
			budgetCap(prefix, tenant{x.org, x.model}, err)
			x.refused, x.startRefused = err, true
			if req.Body != nil {
				req.Body.Close()
			}
			// Not sent: the Transport frees its slots at once, and the
			// Gate's budgets (its key's) charge it nothing.
			return nil, fmt.Errorf("%w: %w", slots.ErrNotSent, err)
		}
	}
	return t.next.RoundTrip(req)
}

func (s *spending) cancel() {
	s.local.Cancel()
	s.each(s.fleet.Cancel)
}

// each sends a correction of the fleet's reservations, unless the store
// is held unavailable: the estimates stand then, as they do when a
// correction is lost.
func (s *spending) each(f func(context.Context) error) {
	if len(s.fleet.Reserved()) == 0 || s.down() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	_ = f(ctx)
}

// reserveBudgets reserves cost, for t's request, of its org's budget and,
// with a fleet, the provider's and the model's. It returns what it
// reserved, or the refusal of the first that cannot take it (nothing
// reserved then) with the cap to name. A fleet budget whose store cannot
// be reached refuses the request with fleet.on_unavailable "closed" (503),
// and else lets it through uncounted (logged).
func (g *Gateway) reserveBudgets(ctx context.Context, t tenant, cost pacing.Tokens) (*spending, string, error) {
	s := &spending{}
	org, model := t.Org, t.Model
	if fb := g.fleetBudgets; fb != nil {
		if err := g.caps.Unavailable("the budgets' store"); err != nil { // held unavailable: no call waits for it
			if fb.closed {
				return nil, pacing.CapProvider, err
			}
			g.uncounted(fb, err)
			return s, "", nil
		}
		s.down, s.timeout = g.caps.StoreUnavailable, fb.timeout
		var orgs *fleet.Budget
		if limits := g.orgLimits(org); limits != nil {
			var err error
			if orgs, err = fleet.NewBudget(fb.tenants, orgBudgetName(org), *limits, fb.timeout); err != nil {
				return nil, "tenant", err
			}
		}
		var uncounted func(int, error)
		if !fb.closed {
			uncounted = func(_ int, err error) { g.uncounted(fb, err) }
		}
		// The budgets, and the prefixes of their refusals' caps.
		budgets, prefixes := []*fleet.Budget{orgs, fb.provider, fb.models[model]}, []string{"tenant", "", "model"}
		var i int
		var err error
		if s.fleet, i, err = fleet.ReserveAll(ctx, cost, uncounted, budgets...); err != nil {
			return nil, budgetCap(prefixes[i], t, err), err
		}
		return s, "", nil
	}
	if g.orgBudgets == nil {
		return s, "", nil
	}
	var err error
	if s.local, err = g.orgBudgets.Reserve(org, cost); err != nil {
		return nil, budgetCap("tenant", t, err), err
	}
	return s, "", nil
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
