package redisstore

// KeyOf is the Redis key of name's leases in s.
func KeyOf(s *Store, name string) string { return s.key(name) }
