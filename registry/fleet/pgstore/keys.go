package pgstore

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strings"
	"unicode/utf8"
)

// maxStoredKey bounds the bytes of a key or a flow name kept as it is: a
// primary key holds the fleet, a key and a flow, and PostgreSQL's B-tree
// refuses entries of more than about 2.7 kB.
const maxStoredKey = 512

// hashed marks a stored key made from a hash: `\x`, as PostgreSQL writes
// bytes in hex.
const hashed = `\x`

// StoredKey returns the text under which the store keeps key, or a flow's
// name, in its tables (the key column of inflight_lease, for instance).
// It is key itself when key is UTF-8 without a NUL byte, at most 512 bytes
// long and does not begin with `\x`; any other key is kept as `\x`
// followed by the hex SHA-256 of its bytes, since a text column refuses
// such bytes and an index such lengths, while the fleet accepts any string
// (up to its key bound, see registry.WithMaxKeyBytes). Two keys meet on
// the store only if they are equal (or their SHA-256 collide).
func StoredKey(key string) string {
	if keptAsIs(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return hashed + hex.EncodeToString(sum[:])
}

func keptAsIs(key string) bool {
	return len(key) <= maxStoredKey && !strings.HasPrefix(key, hashed) &&
		strings.IndexByte(key, 0) < 0 && utf8.ValidString(key)
}

// storedKeys returns keys as StoredKey has them: keys itself when each is
// kept as it is (no copy on the common path), else a copy.
func storedKeys(keys []string) []string {
	for i, k := range keys {
		if !keptAsIs(k) {
			out := make([]string, len(keys))
			copy(out, keys[:i])
			for j := i; j < len(keys); j++ {
				out[j] = StoredKey(keys[j])
			}
			return out
		}
	}
	return keys
}

// validName reports whether name can be a fleet's name or a process's:
// text the tables keep as it is.
func validName(name string) bool { return name != "" && keptAsIs(name) }

// units is what a lease of n units weighs in the tables: 1 for 0 (or
// less), at most what an int column holds (slots.MaxUnits).
func units(n int) int32 {
	return int32(min(max(n, 1), math.MaxInt32))
}

// bound is a queue's bound (driver.AdmitCall's MaxQueue, MaxFlowQueue) as
// the functions take it, an int: a bound past what an int holds bounds no
// queue that can be, and is kept at the most an int holds (a negative
// one, no bound, stays negative).
func bound(n int) int32 {
	return int32(min(max(n, -1), math.MaxInt32))
}

// limits are ls as the functions take them.
func limits(ls []int) []int64 {
	out := make([]int64, len(ls))
	for i, n := range ls {
		out[i] = int64(n)
	}
	return out
}
