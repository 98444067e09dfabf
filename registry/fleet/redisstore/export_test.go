package redisstore

// KeyOf is the Redis key of name's leases in s.
func KeyOf(s *Store, name string) string { return s.key(name) }

// WakeChannel is the channel of proc's grants in s.
func WakeChannel(s *Store, proc string) string { return s.wakePrefix + proc }
