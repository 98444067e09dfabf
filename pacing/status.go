package pacing

import (
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
	ByKey          map[string]int // in flight per API key
	// Tokens are the tokens of the requests in flight (AcquireN; a request
	// of Acquire weighs one), in all and per model with any; TokenLimit is
	// Config.MaxInflightTokens (0: none).
	Tokens        int
	TokenLimit    int
	TokensByModel map[string]int
	NextStartIn   time.Duration // until the provider's next start is allowed (0: now)
	LastStart     time.Time     // the provider's last granted start (zero: none yet)
	Rejected      uint64        // queue full, wait timeout, or heavier than a token cap
	Bypassed      uint64        // proceeded without a slot after the queue wait ("proceed")
	// DoubleReleases counts Release calls on a slot already released, or
	// on a copy of a Slot: misuse, which frees nothing.
	DoubleReleases uint64
	Queue          slots.QueueStats // who waits: per class, and the flows with the most waiters
}

// Status returns the Gate's state now.
func (g *Gate) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.eng.Clock.Nanos()
	st := Status{InFlight: g.provider.Holders.Len(), Queued: g.provider.Waiters.Len(), ByModel: map[string]int{}, WaitingByModel: map[string]int{}, ByKey: map[string]int{},
		Tokens: g.tok.held, TokenLimit: g.tok.limit, TokensByModel: map[string]int{},
		Rejected: g.rejects, Bypassed: g.bypassed, DoubleReleases: g.eng.Misuses()}
	by, top := g.provider.Waiters.Top(slots.TopFlowsMax)
	st.Queue = slots.QueueStats{Waiting: st.Queued, Interactive: by[core.ClassHigh], Default: by[core.ClassDefault], Batch: by[core.ClassLow]}
	for _, f := range top {
		st.Queue.TopFlows = append(st.Queue.TopFlows, slots.FlowStat(f))
	}
	for name, ml := range g.models {
		if n := ml.lane.Holders.Len(); n > 0 {
			st.ByModel[name] = n
			st.TokensByModel[name] = ml.tok.held
		}
		if ml.waiting > 0 {
			st.WaitingByModel[name] = ml.waiting
		}
	}
	for _, k := range g.keys {
		st.ByKey[k.id] = k.lane.Holders.Len()
	}
	if g.started {
		st.LastStart = g.eng.Clock.Time(g.last)
		if g.next > now {
			st.NextStartIn = time.Duration(g.next - now)
		}
	}
	return st
}
