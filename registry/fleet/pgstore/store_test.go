package pgstore_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// pool returns a pool on srv of at most n connections, closed at cleanup.
func pool(t testing.TB, srv *pgtest.Server, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(srv.URL)
	require.NoError(t, err)
	cfg.MaxConns = n
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// store returns the store of the fleet name on srv, on a pool of its own.
func store(t testing.TB, srv *pgtest.Server, name string, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(context.Background(), pool(t, srv, 10), name, opts...)
	require.NoError(t, err)
	return s
}

// process is one process of a fleet on srv: its own pool, store and
// Registry.
func process(t *testing.T, srv *pgtest.Server, name string, limit int, opts ...fleet.Option) *fleet.Registry[string] {
	t.Helper()
	r := fleet.New[string](store(t, srv, name), limit, opts...)
	t.Cleanup(r.Close)
	return r
}

// Ten replicas that start at once migrate the schema once, and all work.
func TestMigrateAtOnce(t *testing.T) {
	srv := pgtest.Start(t)
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		p := pool(t, srv, 2)
		wg.Go(func() { errs[i] = pgstore.Migrate(context.Background(), p) })
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	var v, r int
	require.NoError(t, pool(t, srv, 1).QueryRow(context.Background(), "SELECT version FROM inflight_schema").Scan(&v))
	assert.Equal(t, pgstore.SchemaVersion, v)
	require.NoError(t, pool(t, srv, 1).QueryRow(context.Background(), "SELECT revision FROM inflight_schema_revision").Scan(&r))
	assert.Equal(t, pgstore.SchemaRevision, r)
}

// A database migrated by a release before the budgets (schema version 1,
// no revision) gets them added, and keeps working for both releases: its
// version stays 1.
func TestMigrateRevision(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 2)
	require.NoError(t, pgstore.Migrate(ctx, p))
	_, err := p.Exec(ctx, "DROP TABLE inflight_schema_revision, inflight_budget; DROP FUNCTION inflight_budget")
	require.NoError(t, err)
	require.NoError(t, pgstore.Migrate(ctx, p))
	s, err := pgstore.New(ctx, p, "f")
	require.NoError(t, err)
	res, err := s.Budget(ctx, &driver.BudgetCall{Key: "b", Limits: [3]int64{10}, Cost: [3]int64{4, 4}})
	require.NoError(t, err)
	assert.True(t, res.Charged)
	assert.Equal(t, [3]int64{4, 4, 0}, res.Used)
	var v int
	require.NoError(t, p.QueryRow(ctx, "SELECT version FROM inflight_schema").Scan(&v))
	assert.Equal(t, 1, v, "a release that knows no revision still finds its version")
}

// A database migrated by a newer release is refused with ErrSchemaNewer.
func TestSchemaNewer(t *testing.T) {
	srv := pgtest.Start(t)
	p := pool(t, srv, 2)
	require.NoError(t, pgstore.Migrate(context.Background(), p))
	_, err := p.Exec(context.Background(), "UPDATE inflight_schema SET version = version + 1")
	require.NoError(t, err)
	_, err = pgstore.New(context.Background(), p, "f")
	assert.ErrorIs(t, err, pgstore.ErrSchemaNewer)
}
