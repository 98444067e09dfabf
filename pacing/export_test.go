package pacing

// QueuedTokens returns the tokens counted as queued for g's token cap and,
// summed, for its models' caps (grant.queue), read under g's lock.
func QueuedTokens(g *Gate) (provider, models int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ml := range g.models {
		models += ml.tok.queued
	}
	return g.tok.queued, models
}
