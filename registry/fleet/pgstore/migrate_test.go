package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A schema migrated by its owner serves a role that may use its tables
// and functions but create nothing: New finds it current without DDL.
func TestNewWithoutCreate(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.Migrate(ctx, owner))
	_, err := owner.Exec(ctx, `CREATE ROLE gateway LOGIN;
		REVOKE CREATE ON SCHEMA public FROM PUBLIC;
		GRANT USAGE ON SCHEMA public TO gateway;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO gateway;
		GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO gateway`)
	require.NoError(t, err)
	p, err := pgxpool.New(ctx, strings.Replace(srv.URL, "inflight@", "gateway@", 1))
	require.NoError(t, err)
	t.Cleanup(p.Close)

	s, err := pgstore.New(ctx, p, "least")
	require.NoError(t, err)
	r := fleet.New[string](s, 1, fleet.WithUnavailable(fleet.FailClosed))
	defer r.Close()
	slot, err := r.TryAcquire("k")
	require.NoError(t, err)
	assert.False(t, slot.Bypassed())
	slot.Release()
}

// A database with the tables and no version (the row deleted, or set to 0)
// is refused with an error that says so, not with the first table's
// "already exists".
func TestMigrateWithoutVersion(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 2)
	require.NoError(t, pgstore.Migrate(ctx, p))
	for _, change := range []string{"DELETE FROM inflight_schema", "INSERT INTO inflight_schema VALUES (0)"} {
		_, err := p.Exec(ctx, change)
		require.NoError(t, err)
		_, err = pgstore.New(ctx, p, "f")
		require.Error(t, err, change)
		assert.Contains(t, err.Error(), "inflight_schema has no version", change)
	}
}
