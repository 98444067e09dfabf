package pacing

import (
	"maps"
	"slices"
	"time"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/slots"
)

// Status is a Gate's state now.
type Status struct {
	InFlight int
	Queued   int
	ByModel  map[string]int // in flight per model with any
	// WaitingByModel counts the queued requests per model with any. The
	// Gate has one queue, the provider's, so these sum to Queued; a
	// request waits for its model's cap, its model's spacing or the
	// provider's, whichever binds.
	WaitingByModel map[string]int
	ByKey          map[string]int // in flight per API key, also one taken out of the pool while in flight
	// Tokens are the tokens of the requests in flight (AcquireN; a request
	// of Acquire weighs one), in all and per model with any; TokenLimit is
	// Config.MaxInflightTokens (0: none).
	Tokens        int
	TokenLimit    int
	TokensByModel map[string]int
	// Budgets are the token budgets per minute, the provider's first, then
	// the models' by name.
	Budgets     []BudgetStatus
	NextStartIn time.Duration // until the provider's next start is allowed (0: now)
	LastStart   time.Time     // the provider's last granted start (zero: none yet)
	Rejected    uint64        // queue full, wait timeout, heavier than a token cap, or over a budget
	Bypassed    uint64        // proceeded without a slot after the queue wait ("proceed")
	// DoubleReleases counts Release calls on a slot already released, or
	// on a copy of a Slot: misuse, which frees nothing.
	DoubleReleases uint64
	Queue          slots.QueueStats // who waits: per class, and the flows with the most waiters
}

// BudgetStatus is a budget per minute: its Cap (a budget's name, as
// CapTokensPerMinute or CapMaxRequestsPerMinute), its Model or Key (both
// "" for the provider's), its Limit, and what is Left of it over the last
// minute (negative in debt: a request used more tokens than estimated).
// ResetIn is how long until all of it is left again, if nothing more
// starts. Queued is what the requests waiting for it are estimated to cost
// (0 for a key's: a request is given its key as it starts).
type BudgetStatus struct {
	Cap     string
	Model   string
	Key     string // the API key's id, for a key's budget ("" else)
	Limit   int
	Left    int
	ResetIn time.Duration
	Queued  int
}

// Budgets returns the budgets per minute as Status does, without
// the rest (for an answer's rate-limit headers, say).
func (g *Gate) Budgets() []BudgetStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.budgetsLocked(g.eng.Clock.Nanos())
}

func (g *Gate) budgetsLocked(now int64) []BudgetStatus {
	st := g.bud.status(nil, "", "", now)
	for _, name := range slices.Sorted(maps.Keys(g.models)) {
		st = g.models[name].bud.status(st, name, "", now) // none without budgets
	}
	for _, k := range g.keys {
		st = k.bud.status(st, "", k.id, now)
	}
	return st
}

// Status returns the Gate's state now.
func (g *Gate) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.eng.Clock.Nanos()
	st := Status{InFlight: g.provider.Holders.Len(), Queued: g.provider.Waiters.Len(), ByModel: map[string]int{}, WaitingByModel: map[string]int{}, ByKey: map[string]int{},
		Tokens: g.tok.held, TokenLimit: g.tok.limit, TokensByModel: map[string]int{},
		Rejected: g.rejects, Bypassed: g.bypassed, DoubleReleases: g.eng.Misuses()}
	st.Queue = core.QueueStats[slots.QueueStats, slots.FlowStat](&g.provider.Waiters)
	for name, ml := range g.models {
		if n := ml.lane.Holders.Len(); n > 0 {
			st.ByModel[name] = n
			st.TokensByModel[name] = ml.tok.held
		}
		if ml.waiting > 0 {
			st.WaitingByModel[name] = ml.waiting
		}
	}
	st.Budgets = g.budgetsLocked(now)
	for _, k := range g.keys {
		st.ByKey[k.id] = k.lane.Holders.Len()
	}
	for id, k := range g.goneKeys {
		if n := k.lane.Holders.Len(); n > 0 {
			st.ByKey[id] = n
		}
	}
	if g.started {
		st.LastStart = g.eng.Clock.Time(g.last)
		st.NextStartIn = max(time.Duration(nextStart(g.started, g.last, g.interval)-now), 0)
	}
	return st
}
