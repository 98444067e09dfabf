package pacing

import (
	"cmp"
	"maps"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

type modelLane struct {
	name       string
	lane       core.Lane // lane.Waiters unused: the Gate has one queue
	waiting    int       // its requests queued (grant.queue)
	interval   time.Duration
	last       int64
	started    bool     // a start has been granted (last is meaningful)
	lastID     uint64   // the hold that made the last start
	configured bool     // kept while idle, so its spacing holds
	capCfg     int      // its max_concurrent_requests (0: none)
	l          *learner // its learned cap, with ModelConfig.Adaptive; else nil
	tok        tokens   // its tokens in flight, and ModelConfig.MaxInflightTokens
	bud        *budgets // its token budgets, when configured; else nil
}

type keyLane struct {
	id         string
	lane       core.Lane
	configured int      // its max_concurrent_requests (0: none)
	l          *learner // its learned cap, with Config.Adaptive; else nil
	outUntil   int64    // out of quota: no grants before it, clock nanos
	bud        *budgets // its token budgets (KeyConfig.BudgetLimits), or nil
}

// limitOf is a configured cap as a lane's limit: 0 is none.
func limitOf(n int) int { return cmp.Or(n, slots.Unlimited) }

// applyLocked installs cfg's limits and spacing; lanes keep their holders.
func (g *Gate) applyLocked(cfg Config) {
	if n := cfg.MaxQueuePerFlow; n != nil { // the Gate's own, not the caller's to change
		cfg.MaxQueuePerFlow = &[]int{*n}[0]
	}
	g.cfg = cfg
	g.interval = cfg.Interval()
	g.provider.Limit = limitOf(cfg.MaxConcurrentRequests)
	g.provider.Shares = cfg.shares()
	g.tok.limit = cfg.MaxInflightTokens
	g.bud = g.retireBudgetsLocked(cfg)
	for name, ml := range g.models {
		if _, still := cfg.Models[name]; !still && ml.configured {
			ml.configured = false
			ml.lane.Limit, ml.interval, ml.capCfg, ml.tok.limit = slots.Unlimited, 0, 0, 0
			ml.bud = nil
			g.dropIfIdleLocked(ml)
		}
	}
	for name, m := range cfg.Models {
		ml := cmp.Or(g.models[name], &modelLane{name: name})
		g.models[name], ml.configured = ml, true
		ml.lane.Limit, ml.capCfg = limitOf(m.MaxConcurrentRequests), m.MaxConcurrentRequests
		ml.tok.limit = m.MaxInflightTokens
		ml.bud = g.budgetsForLocked("model:"+name, ml.bud, limitsOf(m.BudgetLimits))
		ml.interval = cfg.ModelInterval(name)
	}
	// Keys keep their lanes (and so their holders) by id; a key no longer
	// in the pool leaves the pick list and drains.
	g.keys, g.keyBudgets = g.keys[:0], false
	pool := make(map[string]*keyLane, len(cfg.APIKeys))
	for _, k := range cfg.APIKeys {
		kl := cmp.Or(g.keyByID[k.ID], g.goneKeys[k.ID], &keyLane{id: k.ID}) // put back: its holders still count
		delete(g.goneKeys, k.ID)
		kl.lane.Limit, kl.configured = limitOf(k.MaxConcurrentRequests), k.MaxConcurrentRequests
		kl.bud = g.budgetsForLocked("key:"+k.ID, kl.bud, limitsOf(k.BudgetLimits))
		g.keyBudgets = g.keyBudgets || kl.bud != nil
		g.keys = append(g.keys, kl)
		pool[k.ID] = kl
	}
	for id, kl := range g.keyByID { // taken out: kept while its requests are in flight
		if pool[id] == nil {
			g.goneKeys[id] = kl
			kl.l.stop() // its learning stops; armed anew if it comes back
		}
	}
	maps.DeleteFunc(g.goneKeys, func(_ string, kl *keyLane) bool { return kl.lane.Holders.Len() == 0 })
	g.keyByID = pool
	g.requeueLocked()
	g.adaptLocked()
}

// dropIfIdleLocked forgets an unconfigured model's lane once nothing uses it.
func (g *Gate) dropIfIdleLocked(ml *modelLane) {
	// Only the lane the map holds: one a refused waiter still points to
	// may have been replaced by a new lane of the same name meanwhile.
	if !ml.configured && ml.lane.Holders.Len() == 0 && ml.waiting == 0 && g.models[ml.name] == ml {
		delete(g.models, ml.name)
	}
}

// pickKeyLocked returns the key with the most free capacity, first in the
// pool's order on a tie; nil when the pool is empty or full. A key out of
// quota until after now is passed over. With t nil, whatever its budgets;
// for a request costing *t, a key whose budgets (KeyConfig.BudgetLimits)
// cannot take it now is passed over too (zero Tokens: the least any
// request costs, its one request), and *fitAt, if not nil, is lowered to
// when the first such key with room would.
func (g *Gate) pickKeyLocked(now int64, t *Tokens, fitAt *int64) *keyLane {
	var best *keyLane
	bestFree := 0
	for _, k := range g.keys {
		if k.outUntil > now {
			continue
		}
		free := k.lane.Limit - k.lane.Holders.Len()
		if free <= bestFree {
			continue
		}
		if t != nil {
			if at, _ := k.bud.fitAt(*t, charges{}, now); at != 0 {
				if fitAt != nil {
					lower(fitAt, at)
				}
				continue
			}
		}
		best, bestFree = k, free
	}
	return best
}
