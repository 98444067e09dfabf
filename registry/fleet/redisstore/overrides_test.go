package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// told records the names an Overrides tells changed.
type told struct {
	mu    sync.Mutex // protects names
	names []string
}

func (c *told) add(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names = append(c.names, name)
}

func (c *told) has(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.names, name)
}

// Two fleets of one name and prefix in two databases of one Redis share
// its pub/sub channels: the overrides that one sets reach the other's
// processes as messages, which they must not take. Each keeps its own.
func TestOverridesOfAnotherDatabase(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	overrides := func(db int) (*fleet.Overrides, *told) {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: db})
		t.Cleanup(func() { c.Close() })
		var tc told
		o, err := fleet.NewOverrides(redisstore.New(c, "gw"), "orgs", tc.add, nil)
		require.NoError(t, err)
		t.Cleanup(o.Close)
		require.NoError(t, o.Sync(ctx))
		return o, &tc
	}
	a, _ := overrides(0)
	b, bTold := overrides(1)
	b2, _ := overrides(1)
	require.NoError(t, b.Set(ctx, "tenant-b", 7))

	require.NoError(t, a.Set(ctx, "tenant-a", 100))
	// Published after a's, so b's subscription has a's message when it has this.
	require.NoError(t, b2.Set(ctx, "marker", 1))
	require.Eventually(t, func() bool { return bTold.has("marker") }, 10*time.Second, time.Millisecond)

	assert.False(t, bTold.has("tenant-a"), "b was told of a's override")
	require.NoError(t, b.Sync(ctx))
	assert.Equal(t, map[string]int{"tenant-b": 7, "marker": 1}, b.All())
	assert.Equal(t, map[string]int{"tenant-a": 100}, a.All())
}
