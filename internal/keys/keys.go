// Package keys holds the small rules the registries apply to their keys and
// maps of keys, written once: dropping repeats from a caller's keys, and
// remaking a map that has shrunk after a burst.
package keys

import (
	"maps"
	"slices"
)

// Dedupe returns keys without repeats, in first-seen order, in a new slice.
func Dedupe[K comparable](keys []K) []K {
	uniq := make([]K, 0, len(keys))
	if len(keys) <= 8 { // a scan beats a map for a few keys
		for _, k := range keys {
			if !slices.Contains(uniq, k) {
				uniq = append(uniq, k)
			}
		}
		return uniq
	}
	seen := make(map[K]struct{}, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			uniq = append(uniq, k)
		}
	}
	return uniq
}

// Remade returns m, or, if it has shrunk to a quarter of its peak (of
// minPeak entries or more), a copy of it made anew, with *peak reset to its
// size. A Go map keeps its buckets when entries are deleted: so its memory
// follows what is live after a burst. The caller keeps *peak at the most
// entries m has held since it was last made.
func Remade[M ~map[K]V, K comparable, V any](m M, peak *int, minPeak int) M {
	n := len(m)
	if *peak < minPeak || n*4 > *peak {
		return m
	}
	fresh := make(M, n)
	maps.Copy(fresh, m)
	*peak = n
	return fresh
}

// Trimmed is Remade for a slice: s, or, once it has shrunk to a quarter of
// its array (of minCap or more), a copy of it, as slices.Delete keeps the
// array; nil when s is empty.
func Trimmed[S ~[]E, E any](s S, minCap int) S {
	switch {
	case len(s) == 0:
		return nil
	case cap(s) >= minCap && len(s)*4 <= cap(s):
		return slices.Clone(s)
	}
	return s
}
