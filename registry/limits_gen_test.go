package registry

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A fetch of a key's limit recorded before the key's record was pruned
// never passes for one recorded after: their generations differ, so the
// older one, applied late (its goroutine held up between its record and
// its apply, which waits for the registry's multi-key lock), does not
// overwrite the newer limit. Found by review: each record counted its
// fetches from zero, and a record made anew after a prune gave its first
// fetch the generation of the pruned record's first.
func TestFetchedLimitGenerationsNeverRepeatForAKey(t *testing.T) {
	limits := []int{5, 1}
	r := NewWithLimitFunc[string](64, func(context.Context, string) (int, error) {
		n := limits[0]
		limits = limits[1:]
		return n, nil
	}, time.Minute)
	sh, _ := r.shardFor("org")
	fetch := func() (int, uint64) {
		sh.mu.Lock()
		rv := sh.resolved["org"]
		f := &fetching{done: make(chan struct{})}
		rv.fetch = f
		sh.resolved["org"] = rv
		sh.mu.Unlock()
		n, gen, err := r.fetchLimit(context.Background(), sh, "org", 0, f)
		require.NoError(t, err)
		return n, gen
	}
	n, older := fetch()
	require.Equal(t, 5, n)
	sh.mu.Lock()
	r.pruneResolvedLocked(sh, math.MaxInt64/2) // idle, and long past its retention
	_, kept := sh.resolved["org"]
	sh.mu.Unlock()
	require.False(t, kept, "pruned")
	n, newer := fetch()
	require.Equal(t, 1, n)
	assert.NotEqual(t, older, newer, "the fetch from before the prune must not pass for the one after")
	sh.mu.Lock()
	defer sh.mu.Unlock()
	assert.Equal(t, newer, sh.resolved["org"].gen)
}
