package pacing

// Requests that weigh tokens: Gate.AcquireN and the token caps
// (Config.MaxInflightTokens, ModelConfig.MaxInflightTokens).

import (
	"context"
	"math"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// The caps on tokens a Gate names in a refusal's slots.LimitError.Cap.
const (
	CapTokens      = "tokens"       // the provider's tokens in flight (Config.MaxInflightTokens)
	CapModelTokens = "model_tokens" // the model's (ModelConfig.MaxInflightTokens)
)

// tokens counts the tokens of the requests in flight under one cap.
type tokens struct {
	held   int
	queued int // the tokens of the requests queued (grant.queue)
	limit  int // 0: no cap
	// told is the returns told to the requests refused while the cap
	// was set (retryAfterLocked).
	told core.Told
}

// retryAfterLocked is when a request of n tokens refused at now is
// expected to fit the cap t, whose holders are ln's: as a weighted
// caller's on a lane (core.HoldTime.RetryAfter), from when its holders
// started and the tokens each holds, behind the tokens of the requests
// queued for it and of the returns told to the others refused on it, half
// of wait earlier. 0 without a cap.
func (t *tokens) retryAfterLocked(g *Gate, ln *core.Lane, n int, wait time.Duration, now int64) time.Duration {
	if t.limit == 0 {
		return 0
	}
	var buf [core.EndsScan]core.End
	ends := ln.Holders.Ends(buf[:0], func(h *core.Hold) int { return int(h.Owner.(*grant).units) }, t.held)
	need := n - (t.limit - t.held) + t.queued
	hold := g.eng.HoldTime()
	lead := min(wait/2, time.Duration(float64(hold.Mean())*float64(n)/float64(t.limit)/2))
	return hold.RetryAfter(now, n, need, t.limit, ends, lead, &t.told)
}

// fits reports whether n more tokens fit under the cap.
func (t tokens) fits(n int) bool { return t.limit == 0 || n <= t.limit-t.held }

// AcquireN is Acquire for a request that weighs n tokens (its prompt and
// the most it may answer, as estimated by the caller): besides the caps on
// requests, it takes n of the provider's and the model's tokens in flight
// (Config.MaxInflightTokens, ModelConfig.MaxInflightTokens), which its
// Slot frees with the rest. Acquire weighs one token.
//
// Flows (slots.WithFlow) take turns by what their requests cost: a request
// costs its larger share of the provider's caps, so flows share its tokens
// when the token cap binds, and its slots when the request cap does.
//
// While a request's tokens do not fit the provider's cap, the requests
// after it may start past it until they have taken 4 times its tokens (of
// other flows or classes, half of them); then it keeps every request after
// it from them, and is served as soon as enough are free. The same holds
// for a model's cap and its requests. A request heavier than a token cap
// could wait forever: it is refused at once with a *slots.LimitError
// wrapping slots.ErrExceedsLimit (Cap CapTokens or CapModelTokens), or
// while it waits when Reconfigure lowers the cap below it. n outside
// 1..slots.MaxUnits fails with slots.ErrBadUnits.
func (g *Gate) AcquireN(ctx context.Context, model string, n int) (Grant, error) {
	if err := g.eng.Check(ctx, n, false); err != nil {
		return Grant{}, err
	}
	return g.acquire(ctx, model, Tokens{Input: n})
}

// turnCostLocked returns what a request of n tokens charges its flow's
// turn, so that flows share whichever of the provider's caps binds: 1
// without a token cap (requests alone), n without a request cap (tokens
// alone), and with both, the larger of a request slot and the request's
// share of the token cap, counted in slots of 1024 (a power of 2, so that
// turns of requests that all take one slot alternate as they do at 1).
// (A model's caps are left out: only its own requests draw on them, and
// they hold those back by themselves.)
func (g *Gate) turnCostLocked(n int) int32 {
	r, t := int64(g.provider.Limit), int64(g.tok.limit)
	switch {
	case t <= 0:
		return 1
	case r <= 0 || r >= slots.Unlimited:
		return int32(n)
	}
	return int32(min(max(1024, math.Ceil(float64(n)*float64(r)*1024/float64(t))), math.MaxInt32))
}

// tooHeavyLocked names the token cap that can never hold n tokens of a
// request for ml, with the cap's tokens held and its limit, or returns "".
func (g *Gate) tooHeavyLocked(ml *modelLane, n int) (name string, held, limit int) {
	switch {
	case g.tok.limit > 0 && n > g.tok.limit:
		return CapTokens, g.tok.held, g.tok.limit
	case ml.tok.limit > 0 && n > ml.tok.limit:
		return CapModelTokens, ml.tok.held, ml.tok.limit
	}
	return "", 0, 0
}

// exceedsLocked builds the refusal of a request for ml weighing n tokens
// that a token cap can never hold: no Retry-After (coming back cannot
// help), and none counted among the returns told to the others refused.
func (g *Gate) exceedsLocked(ml *modelLane, n int) *core.Rejection {
	g.rejects++
	rej := &core.Rejection{Err: slots.ErrExceedsLimit, Key: g.name + "/" + ml.name, Queued: g.provider.Waiters.Len()}
	rej.Cap, rej.InFlight, rej.Limit = g.tooHeavyLocked(ml, n)
	return rej
}

// refuseHeavyLocked refuses the waiters that a token cap, lowered by
// Reconfigure, can no longer hold, leaving them in wk to be woken.
func (g *Gate) refuseHeavyLocked(wk *core.Wakes) {
	if g.isClosed {
		return // its waiters fail with ErrGateClosed
	}
	var heavy []*core.Waiter
	for w := range g.queuedLocked() {
		gr := w.Hold.Owner.(*grant)
		if name, _, _ := g.tooHeavyLocked(gr.model, int(gr.units)); name != "" {
			heavy = append(heavy, w)
		}
	}
	for _, w := range heavy {
		g.unqueueLocked(w)
	}
	for _, w := range heavy { // each refusal counts the queue without them
		gr := w.Hold.Owner.(*grant)
		gr.refused = g.exceedsLocked(gr.model, int(gr.units))
		wk.Refuse(w)
	}
}

// tokensFit is the token part of nextLocked's choice, for one pass over
// the queue in its order: whether w's tokens fit the caps in flight and
// the budgets. A request whose tokens in flight do not fit the provider's
// cap (a blocker) lets the requests after it start until they have taken
// core.PassFactor times its tokens, as core.Lane.Candidate does with
// units; from then on it stops the pass. The same holds for a model's cap,
// for that model's requests. A request waiting for a budget stops the pass
// (or its model's) at once: the budget refills meanwhile, so strict order
// loses nothing there.
type tokensFit struct {
	stopped bool
	models  []*modelLane // models whose tokens a waiter keeps
	// passed is the provider's first blocker, and each model's, that the
	// pass went by; looked counts the waiters seen since the first.
	passed  *core.Waiter
	mPassed []*core.Waiter
	looked  int
}

func (t *tokensFit) ok(g *Gate, w *core.Waiter, now int64, wakeAt *int64) bool {
	gr := w.Hold.Owner.(*grant)
	ml := gr.model
	for _, m := range t.models {
		if m == ml {
			return false
		}
	}
	n := int(gr.units)
	if !g.tok.fits(n) {
		t.stopped = !t.pass(w, &t.passed)
		return false
	}
	if at, _ := g.bud.fitAt(gr.cost(), charges{}, now); at != 0 {
		lower(wakeAt, at)
		t.stopped = true
		return false
	}
	if !ml.tok.fits(n) {
		for _, p := range t.mPassed {
			if p.Hold.Owner.(*grant).model == ml {
				return false // passing its model's blocker
			}
		}
		var p *core.Waiter
		if !t.pass(w, &p) {
			t.models = append(t.models, ml)
			return false
		}
		t.mPassed = append(t.mPassed, p)
		return false
	}
	if at, _ := ml.bud.fitAt(gr.cost(), charges{}, now); at != 0 {
		lower(wakeAt, at)
		t.models = append(t.models, ml)
		return false
	}
	return true
}

// scanned reports whether the pass stops: once it has looked at
// core.PassScan waiters since the first blocker it went by, a provider's
// blocker stops it, and models' blockers keep their places from then on
// (their models stop; the others go on).
func (t *tokensFit) scanned() bool {
	if t.stopped || t.passed == nil && len(t.mPassed) == 0 {
		return t.stopped
	}
	if t.looked++; t.looked <= core.PassScan {
		return false
	}
	if t.passed != nil {
		t.stopped = true
		return true
	}
	for _, p := range t.mPassed {
		t.models = append(t.models, p.Hold.Owner.(*grant).model)
	}
	t.mPassed, t.looked = t.mPassed[:0], 0
	return false
}

// pass reports whether the requests after blocker w may still pass it,
// recording it in *first unless one is there already.
func (t *tokensFit) pass(w *core.Waiter, first **core.Waiter) bool {
	units := max(int64(w.Hold.Owner.(*grant).units), 1)
	if w.Passed >= core.PassFactor*units {
		return false
	}
	if *first == nil {
		*first = w
	}
	return true
}

// served counts w's tokens against the blockers it passed: the
// provider's and its model's.
func (t *tokensFit) served(w *core.Waiter) {
	gr := w.Hold.Owner.(*grant)
	units := max(int64(gr.units), 1)
	t.passed.Pass(w, units)
	for _, p := range t.mPassed {
		if p.Hold.Owner.(*grant).model == gr.model {
			p.Pass(w, units)
		}
	}
}

// lower lowers *at to t; 0, as either, is none (a t of 0 changes nothing).
func lower(at *int64, t int64) {
	if t != 0 && (*at == 0 || t < *at) {
		*at = t
	}
}
