package pacing

import "github.com/inflight-go/inflight/slots"

// The caps a Gate names in a refusal's slots.LimitError.Cap: which one
// kept the request from starting. Its InFlight and Limit are that cap's
// (for CapAPIKey, the whole pool's together).
const (
	CapProvider = "provider" // the provider's cap, or its queue's bounds
	CapModel    = "model"    // the request's model's cap
	CapAPIKey   = "api_key"  // every key of the pool at its cap, or out of quota
	CapPacing   = "pacing"   // the spacing of starts (requests per minute, min interval)
	CapPause    = "pause"    // a pause the upstream asked for (its Retry-After)
)

// bindingLocked names what keeps a request for ml from starting now, as
// dispatchLocked tries them, with that cap's holders and limit: the
// provider's cap, the model's, the key pool, a pause the upstream asked
// for, the spacing of starts. A request that could start but for those
// ahead of it in the queue waited for the provider's cap.
func (g *Gate) bindingLocked(ml *modelLane, now int64) (name string, inFlight, limit int) {
	switch {
	case !g.provider.HasRoom():
		return CapProvider, g.provider.Holders.Len(), g.provider.Limit
	case !ml.lane.HasRoom():
		return CapModel, ml.lane.Holders.Len(), ml.lane.Limit
	case len(g.keys) > 0 && g.pickKeyLocked(now) == nil:
		for _, k := range g.keys {
			inFlight += k.lane.Holders.Len()
			limit = addLimits(limit, k.lane.Limit)
		}
		return CapAPIKey, inFlight, limit
	case g.ad.pauseUntil > now:
		return CapPause, g.provider.Holders.Len(), g.provider.Limit
	case g.started && g.next > now, ml.interval > 0 && ml.started && ml.next > now:
		return CapPacing, g.provider.Holders.Len(), g.provider.Limit
	}
	return CapProvider, g.provider.Holders.Len(), g.provider.Limit
}

// addLimits adds two limits; with one slots.Unlimited, the sum is too.
func addLimits(a, b int) int {
	if a > slots.Unlimited-b {
		return slots.Unlimited
	}
	return a + b
}
