package pacing

import (
	"iter"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// The caps a Gate names in a refusal's slots.LimitError.Cap: which one
// kept the request from starting. Its InFlight and Limit are that cap's
// (for CapAPIKey, the whole pool's together).
const (
	CapProvider = "provider" // the provider's cap, or its queue's bounds
	CapModel    = "model"    // the request's model's cap
	CapAPIKey   = "api_key"  // every key of the pool at its cap, or out of quota
	CapPacing   = "pacing"   // the spacing of starts (requests per minute, min interval)
	CapPause    = "pause"    // a pause the upstream asked for (its Retry-After)
	// CapTokens and CapModelTokens (tokens.go) are the caps on tokens.
)

// bindingLocked names what keeps a request for ml costing t from starting
// now, as dispatchLocked tries them, with that cap's holders (or tokens)
// and limit: the provider's cap, the model's, their tokens, the key pool,
// a pause the upstream asked for, the spacing of starts, the budgets. A
// request that could start but for those ahead of it in the queue waited
// for the provider's cap. at is when a binding budget will take it.
func (g *Gate) bindingLocked(ml *modelLane, t Tokens, now int64) (name string, inFlight, limit int, at int64) {
	// The caps in flight, the pool, pauses and spacing first.
	switch n := t.Total(); {
	case !g.provider.HasRoom():
		return CapProvider, g.provider.Holders.Len(), g.provider.Limit, 0
	case !ml.lane.HasRoom():
		return CapModel, ml.lane.Holders.Len(), ml.lane.Limit, 0
	case !g.tok.fits(n):
		return CapTokens, g.tok.held, g.tok.limit, 0
	case !ml.tok.fits(n):
		return CapModelTokens, ml.tok.held, ml.tok.limit, 0
	case len(g.keys) > 0 && g.pickKeyLocked(now, nil, nil) == nil:
		for _, k := range g.keys {
			inFlight += k.lane.Holders.Len()
			limit = addLimits(limit, k.lane.Limit)
		}
		return CapAPIKey, inFlight, limit, 0
	case g.ad.pauseUntil > now:
		return CapPause, g.provider.Holders.Len(), g.provider.Limit, 0
	case nextStart(g.started, g.last, g.interval) > now, nextStart(ml.started, ml.last, ml.interval) > now:
		return CapPacing, g.provider.Holders.Len(), g.provider.Limit, 0
	}
	if at, name = g.budgetsAt(ml, t, afterNone, now); name != "" {
		inFlight, limit = g.budgetUseLocked(ml, name, now)
		return name, inFlight, limit, at
	}
	if g.keyBudgets && g.pickKeyLocked(now, &t, nil) == nil {
		return g.keyBudgetBindingLocked(t, now)
	}
	// Behind a request that waits for tokens or a budget, which none may pass.
	for w := range g.queuedLocked() {
		gr := w.Hold.Owner.(*grant)
		switch n := int(gr.units); {
		case !g.tok.fits(n):
			return CapTokens, g.tok.held, g.tok.limit, 0
		case gr.model == ml && !ml.tok.fits(n):
			return CapModelTokens, ml.tok.held, ml.tok.limit, 0
		}
		at, name = g.bud.binding("", gr.cost(), afterNone, now)
		if name == "" && gr.model == ml {
			at, name = ml.bud.binding("model_", gr.cost(), afterNone, now)
		}
		if name != "" {
			inFlight, limit = g.budgetUseLocked(ml, name, now)
			return name, inFlight, limit, at
		}
	}
	return CapProvider, g.provider.Holders.Len(), g.provider.Limit, 0
}

// queuedLocked yields the Gate's waiters, class by class in its queue's
// order (Queue.Class); the queue must not change meanwhile.
func (g *Gate) queuedLocked() iter.Seq[*core.Waiter] {
	return func(yield func(*core.Waiter) bool) {
		for _, c := range core.Order {
			for el := range g.provider.Waiters.Class(c) {
				if !yield(el.Value) {
					return
				}
			}
		}
	}
}

// addLimits adds two limits; with one slots.Unlimited, the sum is too.
func addLimits(a, b int) int {
	if a > slots.Unlimited-b {
		return slots.Unlimited
	}
	return a + b
}

// poolLocked returns the slots of the pool's keys that are not out of
// quota (slots.Unlimited without a pool), and when every key is: when the
// first is back (then the slots are the whole pool's, from then on).
func (g *Gate) poolLocked(now int64) (pool int, back int64) {
	if len(g.keys) == 0 {
		return slots.Unlimited, 0
	}
	all := 0
	for _, k := range g.keys {
		all = addLimits(all, k.lane.Limit)
		if k.outUntil <= now {
			pool = addLimits(pool, k.lane.Limit)
		}
	}
	if pool == 0 {
		return all, g.keyBackAtLocked(now)
	}
	return pool, 0
}

// rejectLocked builds a rejection of a caller of class c with a
// Retry-After from when a slot or a start is next expected; report it with
// rejected once unlocked.
func (g *Gate) rejectLocked(reason error, ml *modelLane, t Tokens, c uint8, now int64) *core.Rejection {
	g.rejects++
	var wait time.Duration // the wait a caller timed out in may be spent queued again
	if reason == slots.ErrWaitTimeout {
		wait = g.cfg.QueueWait()
	}
	pool, back := g.poolLocked(now)
	rej := g.eng.RejectLaneTurns(reason, g.name+"/"+ml.name, &g.provider, 1, c, min(g.provider.Limit, ml.lane.Limit, pool), wait)
	rej.Cap = CapProvider
	var at int64 // when a binding budget takes it
	switch reason {
	case slots.ErrWaitTimeout:
		rej.Cap, rej.InFlight, rej.Limit, at = g.bindingLocked(ml, t, now)
	case slots.ErrQueueFull: // the provider's queue: its budgets for the caller (not a walk of the queue)
		at, _ = g.budgetsAt(ml, t, afterNone, now)
	}
	// Nothing starts before the first key is back from its quota or the
	// upstream's pause ends: the turns count from then.
	if from := max(back, g.ad.pauseUntil); from > now {
		rej.RetryAfter += retryAt(from, now)
	}
	// Its tokens: when those it needs are expected to free.
	n := t.Total()
	rej.RetryAfter = max(rej.RetryAfter, g.tok.retryAfterLocked(g, &g.provider, n, wait, now), ml.tok.retryAfterLocked(g, &ml.lane, n, wait, now))
	// When a binding budget takes it, and when the provider's and the
	// model's next starts are allowed; rounded up (retryAt), so that a
	// client that honours it does not come back early.
	next := max(at, nextStart(g.started, g.last, g.interval), nextStart(ml.started, ml.last, ml.interval))
	if next > now {
		rej.RetryAfter = max(rej.RetryAfter, retryAt(next, now))
	}
	return rej
}
