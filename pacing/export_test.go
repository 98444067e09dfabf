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

// ArmedTimers returns how many of g's learners have a timer armed, read
// under g's lock.
func ArmedTimers(g *Gate) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	count := func(l *learner) {
		if l != nil && l.timer != nil {
			n++
		}
	}
	count(g.ad.l)
	for _, kl := range g.keys {
		count(kl.l)
	}
	for _, ml := range g.models {
		count(ml.l)
	}
	return n
}
