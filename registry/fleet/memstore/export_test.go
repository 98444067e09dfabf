package memstore

// SetVirtualTime sets the virtual time of the class of rank on key, as a
// backlog that lasted would have moved it, so that a test reaches
// driver.MaxTag without millions of grants.
func (s *Store) SetVirtualTime(key string, rank uint8, vt float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key(key).vt[rank] = vt
}
