package pacing

// Token budgets over time (BudgetLimits) of the provider, its models and
// its API keys (see Gate.AcquireTokens and Gate.Settle).

import (
	"context"
	"slices"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/slots"
)

// The budgets a Gate names in a refusal's slots.LimitError.Cap; a model's
// are these with "model_" before them.
const (
	CapTokensPerMinute       = upstream.CapTokensPerMinute
	CapInputTokensPerMinute  = upstream.CapInputTokensPerMinute
	CapOutputTokensPerMinute = upstream.CapOutputTokensPerMinute
	CapMaxRequestsPerMinute  = upstream.CapMaxRequestsPerMinute
)

// BudgetCap names a budget's part as refusals do: 0 all tokens
// (CapTokensPerMinute), 1 input, 2 output, 3 requests
// (CapMaxRequestsPerMinute); "" for another part.
func BudgetCap(part int) string { return upstream.BudgetCap(part) }

// budgetCaps names the budgets of a lane, in the order of a budgets' array.
var budgetCaps = [budgetParts]string{CapTokensPerMinute, CapInputTokensPerMinute, CapOutputTokensPerMinute, CapMaxRequestsPerMinute}

// Tokens is what a request spends: its prompt's tokens (Input) and its
// answer's (Output). Before it is sent it is an estimate; Settle corrects
// it with what the upstream reports.
type Tokens = upstream.Tokens

// cost is gr's request's estimated cost.
func (gr *grant) cost() Tokens { return Tokens{Input: int(gr.estIn), Output: int(gr.estOut)} }

// queue counts gr as waiting for its model, its estimate as waiting on its
// budgets, and its tokens as queued for the provider's and its model's
// token caps; unqueue takes them off.
func (gr *grant) queue() {
	gr.model.waiting++
	gr.bud = gr.g.budgetsOf(gr.model)
	for _, b := range gr.bud {
		b.queue(gr.cost(), 1)
	}
	gr.g.tok.queued += int(gr.units)
	gr.model.tok.queued += int(gr.units)
}

func (gr *grant) unqueue() {
	gr.model.waiting--
	for _, b := range gr.bud {
		b.queue(gr.cost(), -1)
	}
	gr.bud = [3]*budgets{}
	gr.g.tok.queued -= int(gr.units)
	gr.model.tok.queued -= int(gr.units)
}

// ErrOverBudget: a token budget per minute (BudgetLimits) cannot take the
// request within its wait, or now (a Budget's); the refusal's RetryAfter
// is when it will have refilled enough.
var ErrOverBudget = upstream.ErrOverBudget

// overBudgetRejectLocked builds the refusal of a request for ml that the
// budget name cannot take t before at, more than wait from now. Its
// Retry-After is wait before at: a client that comes back then may queue
// for the rest, so the budget does not idle while refused clients wait.
// Later refusals are told to come back after it.
func (g *Gate) overBudgetRejectLocked(ml *modelLane, t Tokens, name string, at, now int64, wait time.Duration) *core.Rejection {
	g.rejects++
	// It comes back after those told to come back before it.
	if a, n := g.budgetsAt(ml, t, afterTold, now); a > at {
		at, name = a, n
	}
	rej := &core.Rejection{Err: ErrOverBudget, Key: g.name + "/" + ml.name, Cap: name, Queued: g.provider.Waiters.Len(),
		RetryAfter: retryAt(at-int64(wait), now)}
	for _, b := range g.budgetsOf(ml) {
		b.tell(t, now+int64(rej.RetryAfter), now)
	}
	rej.InFlight, rej.Limit = g.budgetUseLocked(ml, name, now)
	return rej
}

// retryAt is the wait until at, rounded up to the millisecond so that a
// client that honours it does not come back early.
func retryAt(at, now int64) time.Duration {
	return (time.Duration(at-now) + time.Millisecond - 1).Truncate(time.Millisecond)
}

// budgetUseLocked returns the tokens counted in the last minute under the
// budget name (a budgetCaps name, "model_" before it for ml's) and its
// limit.
func (g *Gate) budgetUseLocked(ml *modelLane, name string, now int64) (used, limit int) {
	b := g.bud
	if len(name) > 6 && name[:6] == "model_" {
		b, name = ml.bud, name[6:]
	}
	return b.use(name, now)
}

// use returns the tokens counted in the last minute under the budget name
// (a budgetCaps name) and its limit.
func (b *budgets) use(name string, now int64) (used, limit int) {
	if b == nil {
		return 0, 0
	}
	for i, c := range budgetCaps {
		if c == name {
			return int(b.w[i].limit - b.w[i].left(now)), int(b.w[i].limit)
		}
	}
	return 0, 0
}

// AcquireTokens is AcquireN for a request whose cost is estimated as t: it
// weighs t.Total() on the token caps in flight, and it starts only when t
// fits the provider's and its model's budgets per minute (BudgetLimits),
// and is given an API key whose budgets take it. A budget counts what
// started in the last minute, as the requests' estimates corrected by
// Settle, and the requests themselves (MaxRequestsPerMinute, one each); a
// budget with nothing in its last minute admits any request, so a
// budget's first request passes even when it is larger than the budget.
//
// Order on a budget is strict: while a request waits for a refill, the
// budget fills for it and nothing stands idle. A request that a budget
// (the provider's, its model's, or every key's not out of quota) cannot
// take within Config's queue wait, counting the requests already waiting
// for the provider's and the model's, is refused at once with a
// *slots.LimitError wrapping ErrOverBudget, whose RetryAfter is when the
// budget will have refilled enough, less that wait, behind the requests
// told to come back before it (eight budgets' worth of them at most, so
// that a caller asking in a loop cannot push the others back by hours;
// on_wait_timeout "proceed" does not let it through: going ahead would
// only draw the upstream's refusal). Those
// ahead count as a budget's worth each minute, each at most a budget's
// worth: an estimate, which is early when their sizes do not fill the
// minutes evenly (60 and 60 of 100 take two). One whose
// wait times out while a budget still cannot take it is refused with
// slots.ErrWaitTimeout and the budget named in Cap; under "proceed", with
// ErrOverBudget. A refused request
// charges nothing, nor does one whose grant is given back (its caller's
// context ended as it came) or is reported as refused by the upstream
// (Report with a verdict other than Admitted and Other), not even its
// request; one settled stays a request. t's parts must not be negative
// and t.Total() must be in 1..slots.MaxUnits (else slots.ErrBadUnits).
// Acquire and AcquireN charge the budgets as a cost of {Input: n},
// settled by nobody unless Settle is called.
func (g *Gate) AcquireTokens(ctx context.Context, model string, t Tokens) (Grant, error) {
	if err := t.Check(); err != nil {
		g.eng.Rejected(ctx, slots.ErrBadUnits, 0)
		return Grant{}, err
	}
	return g.acquire(ctx, model, t)
}

// Settle corrects what gr's request charged its token budgets with what it
// used, as the upstream reported (an answer's "usage"): an overestimate is
// returned to the budget, an underestimate charged as debt that later
// requests wait for. It may come after the Slot is released. Only the first
// call (or refusal by Report) for a grant counts; each part counts within
// 0..slots.MaxUnits. A grant that went ahead without a slot (Bypassed, on
// on_wait_timeout "proceed") is not settled: its estimate stands.
func (g *Gate) Settle(gr Grant, used Tokens) {
	used.Input, used.Output = min(max(used.Input, 0), slots.MaxUnits), min(max(used.Output, 0), slots.MaxUnits)
	g.settle(gr, used, endedUsage)
}

// own returns the record behind gr's Slot (one Grant copied, or its Slot,
// share it); nil for another Gate's grant, a bypass, or no grant.
func (g *Gate) own(gr Grant) *grant {
	if gr.gate != g || gr.Slot == nil || gr.Slot.Bypassed() || gr.InFlight == 0 {
		return nil
	}
	own, _ := (*core.Handle)(gr.Slot).Hold().Owner.(*grant)
	return own
}

// settle corrects gr's charges to used, for a request that ended so
// (endedUsage...).
func (g *Gate) settle(gr Grant, used Tokens, ended int) {
	own := g.own(gr)
	if own == nil {
		return
	}
	var wk core.Wakes
	g.mu.Lock()
	if g.settleLocked(own, used, ended) {
		g.dispatchLocked(g.eng.Clock.Nanos(), &wk)
	}
	g.mu.Unlock()
	wk.Wake()
}

// settleLocked corrects gr's charges to used, once, for a request that
// ended so (endedUsage...), and reports whether any budget got something
// back, so that the caller dispatches.
func (g *Gate) settleLocked(gr *grant, used Tokens, ended int) bool {
	if gr.settled {
		return false
	}
	gr.settled = true
	now := g.eng.Clock.Nanos()
	for _, b := range gr.bud {
		b.correct(int64(gr.step), gr.cost(), used, ended, now)
	}
	return ended == endedUnserved || used.Input < int(gr.estIn) || used.Output < int(gr.estOut)
}

// budgetsOf returns the budgets a request for ml counts on before it is
// given a key: the provider's and its model's (either may be nil); the
// third, its key's, is set as it starts (dispatchLocked).
func (g *Gate) budgetsOf(ml *modelLane) [3]*budgets { return [3]*budgets{g.bud, ml.bud} }

// After whom a request is placed when budgetsAt estimates its start.
const (
	afterNone   = iota // nobody: it is at the queue's head
	afterQueued        // the requests queued for its budgets
	afterTold          // those, and the refused told to come back later
)

// keyBudgetBindingLocked names the key budget that keeps a request
// costing t from every key with room, for its refusal (it is told to come
// back, see keyRefusalLocked), with its tokens in the last minute, its
// limit, and when it takes the request.
func (g *Gate) keyBudgetBindingLocked(t Tokens, now int64) (name string, used, limit int, at int64) {
	k, at, name := g.keyRefusalLocked(t, true, 0, now)
	if k == nil {
		return CapAPIKey, 0, 0, 0
	}
	used, limit = k.bud.use(name[len("api_key_"):], now)
	return name, used, limit, at
}

// keyBudgetsAtLocked returns the key whose budgets take a request costing
// t first, among the keys not out of quota (with room: and below their
// cap), placed after whom after says; when, and the name of its budget
// that binds until then. A nil key: one takes it now, or none is usable.
func (g *Gate) keyBudgetsAtLocked(t Tokens, room bool, after int, now int64) (k *keyLane, at int64, name string) {
	for _, kl := range g.keys {
		if kl.outUntil > now || room && kl.lane.Limit-kl.lane.Holders.Len() <= 0 {
			continue
		}
		a, n := kl.bud.binding("api_key_", t, after, now)
		if a == 0 {
			return nil, 0, "" // this key's budgets take it now
		}
		if k == nil || a < at {
			k, at, name = kl, a, n
		}
	}
	return k, at, name
}

// keyRefusalLocked is keyBudgetsAtLocked for a request refused by the
// keys' budgets: placed after the refused requests told to come back to
// each key, and told itself to come back to the one that takes it first,
// wait before it does (it may queue for the rest), so that refused
// clients come back spread over the keys' refills.
func (g *Gate) keyRefusalLocked(t Tokens, room bool, wait time.Duration, now int64) (k *keyLane, at int64, name string) {
	if k, at, name = g.keyBudgetsAtLocked(t, room, afterTold, now); k != nil {
		k.bud.tell(t, now+int64(retryAt(at-int64(wait), now)), now)
	}
	return k, at, name
}

// overBudgetLocked returns the refusal of a request for ml costing t that
// a budget cannot start within wait, placed after whom after says: the
// provider's, the model's, or that of every key of the pool not out of
// quota (a key without budgets takes any request); nil when none does.
func (g *Gate) overBudgetLocked(ml *modelLane, t Tokens, after int, wait time.Duration, now int64) *core.Rejection {
	if at, name := g.budgetsAt(ml, t, after, now); at > now+int64(wait) {
		return g.overBudgetRejectLocked(ml, t, name, at, now, wait)
	}
	if !g.keyBudgets {
		return nil
	}
	// Nil: a key takes it, or every key is out of quota (not a budget's doing).
	if k, at, _ := g.keyBudgetsAtLocked(t, false, afterNone, now); k == nil || at <= now+int64(wait) {
		return nil
	}
	return g.keyOverBudgetLocked(ml, t, wait, now)
}

// keyOverBudgetLocked builds the refusal of a request for ml costing t
// that no key's budgets take within wait (keyRefusalLocked).
func (g *Gate) keyOverBudgetLocked(ml *modelLane, t Tokens, wait time.Duration, now int64) *core.Rejection {
	g.rejects++
	k, at, name := g.keyRefusalLocked(t, false, wait, now)
	used, limit := k.bud.use(name[len("api_key_"):], now)
	return &core.Rejection{Err: ErrOverBudget, Key: g.name + "/" + ml.name, Cap: name, Queued: g.provider.Waiters.Len(),
		RetryAfter: retryAt(at-int64(wait), now), InFlight: used, Limit: limit}
}

// budgetsAt returns when the provider's and ml's budgets will take t,
// placed after those that after says, and the name of the budget that
// binds then; 0 and "" when they take it now.
func (g *Gate) budgetsAt(ml *modelLane, t Tokens, after int, now int64) (at int64, name string) {
	at, name = g.bud.binding("", t, after, now)
	if a, n := ml.bud.binding("model_", t, after, now); a > at {
		at, name = a, n
	}
	return at, name
}

// binding is fitAt, with the binding budget named by its budgetCaps name
// after prefix.
func (b *budgets) binding(prefix string, t Tokens, after int, now int64) (at int64, name string) {
	var extra charges
	if after != afterNone {
		extra = b.waiting(after == afterTold, now)
	}
	at, i := b.fitAt(t, extra, now)
	if at == 0 {
		return 0, ""
	}
	return at, prefix + budgetCaps[i]
}

// retireBudgetsLocked, as Reconfigure applies cfg, drops the retired
// budgets whose minute counts nothing, keeps aside those of the models and
// keys that cfg takes out (see budgetsForLocked), and returns the
// provider's budgets under cfg.
func (g *Gate) retireBudgetsLocked(cfg Config) *budgets {
	now := g.eng.Clock.Nanos()
	for name, b := range g.retired {
		if b.empty(now) {
			delete(g.retired, name)
		}
	}
	for name, ml := range g.models {
		if _, still := cfg.Models[name]; !still && ml.configured {
			g.retireLocked("model:"+name, ml.bud)
		}
	}
	for id, kl := range g.keyByID {
		if !slices.ContainsFunc(cfg.APIKeys, func(k KeyConfig) bool { return k.ID == id }) {
			g.retireLocked("key:"+id, kl.bud)
		}
	}
	return g.budgetsForLocked("provider", g.bud, limitsOf(cfg.BudgetLimits))
}

// budgetsForLocked returns the budgets named name ("provider", "model:"
// or "key:" and its name) under limits, as Reconfigure applies them: cur, or
// those retired under name if it has none, so that a budget taken out
// and put back within a minute goes on counting what started under it
// (not what started while it was out); nil when limits are all 0, cur
// then retired. A retired budget whose minute counts nothing at a
// Reconfigure is dropped: what a request still in flight then settles into
// it later is not counted once the budget is put back.
func (g *Gate) budgetsForLocked(name string, cur *budgets, limits [budgetParts]int) *budgets {
	if cur == nil {
		cur = g.retired[name]
	}
	delete(g.retired, name)
	b := newBudgets(cur, limits)
	if b == nil {
		g.retireLocked(name, cur)
	}
	return b
}

// retireLocked keeps b aside under name (nil: nothing to keep).
func (g *Gate) retireLocked(name string, b *budgets) {
	if b == nil {
		return
	}
	if g.retired == nil {
		g.retired = make(map[string]*budgets)
	}
	g.retired[name] = b
}

// requeueLocked counts the queued requests anew on the budgets they are
// queued for (grant.queue), after Reconfigure changed their limits: each
// counts at most a limit's worth, of the limits now.
func (g *Gate) requeueLocked() {
	for w := range g.queuedLocked() {
		for _, b := range w.Hold.Owner.(*grant).bud {
			b.unqueueAll()
		}
	}
	for w := range g.queuedLocked() {
		gr := w.Hold.Owner.(*grant)
		for _, b := range gr.bud {
			b.queue(gr.cost(), 1)
		}
	}
}

// proceedLocked reports whether a wait that timed out under "proceed"
// goes ahead as a bypass: not while a budget still keeps the request back
// (going ahead would only draw the upstream's refusal, see AcquireTokens),
// whose refusal it leaves in gr.refused; if it does, its estimate is
// charged to the provider's and its model's budgets, where it stands (a
// bypass is not settled; it has no key, nor a key's budget).
func (g *Gate) proceedLocked(gr *grant) bool {
	now := g.eng.Clock.Nanos()
	if gr.refused = g.overBudgetLocked(gr.model, gr.cost(), afterNone, 0, now); gr.refused != nil {
		return false
	}
	for _, b := range g.budgetsOf(gr.model) {
		b.charge(gr.cost(), now)
	}
	g.bypassed++
	return true
}
