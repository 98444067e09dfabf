package registry

// CachedLimits returns how many LimitFunc results the registry keeps.
func (r *Registry[K]) CachedLimits() int {
	n := 0
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		n += len(sh.resolved)
		sh.mu.Unlock()
	}
	return n
}

// ShardOf returns the index of key's lock shard.
func (r *Registry[K]) ShardOf(key K) int {
	sh, _ := r.shardFor(key)
	return sh.idx
}

// LockShard locks shard i and returns its unlock; it stands in for a
// goroutine that is descheduled while it holds the lock.
func (r *Registry[K]) LockShard(i int) (unlock func()) {
	r.shards[i].mu.Lock()
	return r.shards[i].mu.Unlock
}

// MultiBusy reports whether multiMu is held by someone.
func (r *Registry[K]) MultiBusy() bool {
	if r.multiMu.TryLock() {
		r.multiMu.Unlock()
		return false
	}
	return true
}

// PrunedAt returns when each shard's cache of fetched limits was last
// pruned (clock nanos), and how many limits it keeps.
func (r *Registry[K]) PrunedAt() (at []int64, kept []int) {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		at, kept = append(at, sh.prunedAt), append(kept, len(sh.resolved))
		sh.mu.Unlock()
	}
	return at, kept
}
