package memstore

// SetVirtualTime sets the virtual time of the class of rank on key, as a
// backlog that lasted would have moved it, so that a test reaches
// driver.MaxTag without millions of grants.
func (s *Store) SetVirtualTime(key string, rank uint8, vt float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key(key).vt[rank] = vt
}

// Finish returns the finish tag of flow in the class of rank on key.
func (s *Store) Finish(key string, rank uint8, flow string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key(key).finish[flowKey{rank, flow}]
}
