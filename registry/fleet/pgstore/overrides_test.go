package pgstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
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

// Two fleets of one name in two schemas of one database share NOTIFY's
// channels: the overrides that one sets reach the other's processes as
// messages, which they must not take. Each keeps its own.
func TestOverridesOfAnotherSchema(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	_, err := pool(t, srv, 1).Exec(ctx, "CREATE SCHEMA a; CREATE SCHEMA b")
	require.NoError(t, err)
	overrides := func(schema string) (*fleet.Overrides, *told) {
		cfg, err := pgxpool.ParseConfig(srv.URL)
		require.NoError(t, err)
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET search_path = "+schema)
			return err
		}
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		s, err := pgstore.New(ctx, p, "gw")
		require.NoError(t, err)
		var c told
		o, err := fleet.NewOverrides(s, "orgs", c.add, nil)
		require.NoError(t, err)
		t.Cleanup(o.Close)
		require.NoError(t, o.Sync(ctx))
		return o, &c
	}
	a, _ := overrides("a")
	b, bTold := overrides("b")
	b2, _ := overrides("b")
	require.NoError(t, b.Set(ctx, "tenant-b", 7))

	require.NoError(t, a.Set(ctx, "tenant-a", 100))
	// Published after a's, so b's listener has a's message when it has this.
	require.NoError(t, b2.Set(ctx, "marker", 1))
	require.Eventually(t, func() bool { return bTold.has("marker") }, 10*time.Second, time.Millisecond)

	assert.False(t, bTold.has("tenant-a"), "b was told of a's override")
	require.NoError(t, b.Sync(ctx))
	assert.Equal(t, map[string]int{"tenant-b": 7, "marker": 1}, b.All())
	assert.Equal(t, map[string]int{"tenant-a": 100}, a.All())
}
