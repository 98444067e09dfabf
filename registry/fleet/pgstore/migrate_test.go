package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/slots"
)

// gatewayRole makes a role that may use the schema's tables and functions
// but create nothing, as a schema migrated by its owner grants them, and
// returns a pool of it.
func gatewayRole(t *testing.T, srv *pgtest.Server, owner *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	_, err := owner.Exec(context.Background(), `CREATE ROLE gateway LOGIN;
		REVOKE CREATE ON SCHEMA public FROM PUBLIC;
		GRANT USAGE ON SCHEMA public TO gateway;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO gateway;
		GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO gateway`)
	require.NoError(t, err)
	p, err := pgxpool.New(context.Background(), strings.Replace(srv.URL, "inflight@", "gateway@", 1))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// A schema migrated by its owner serves a role that may use its tables
// and functions but create nothing: New finds it current without DDL.
func TestNewWithoutCreate(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.Migrate(ctx, owner))
	p := gatewayRole(t, srv, owner)

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

// The database replaced by an empty one (a new cluster, a failover to a
// new database: here its schema emptied) under a fleet of two processes at a cap of 1, one of them
// holding the key: the next calls make the schema again and start a new
// epoch, and the fleet repairs it as after a Redis that lost its data. The
// other process is refused all along (it does not fall back to its local
// cap, as it would on a store it held unreachable), until the holder
// releases; and no process holds the store unavailable.
func TestMigrateAgainOnAnEmptyDatabase(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	opts := []fleet.Option{fleet.WithTimeout(2 * time.Second), fleet.WithLeaseTTL(time.Second)}
	a := process(t, srv, "fresh", 1, opts...)
	b := process(t, srv, "fresh", 1, opts...)
	held, err := a.TryAcquire("k")
	require.NoError(t, err)
	_, err = b.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached)

	// Emptied in place: the processes' connections stay, so that no
	// connection error (which a failover also brings, and the fleet
	// answers as an outage of a moment) hides what follows.
	_, err = pool(t, srv, 1).Exec(ctx, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
	require.NoError(t, err)

	admitted := 0
	assert.Eventually(t, func() bool {
		if s, err := b.TryAcquire("k"); err == nil {
			admitted++
			s.Release()
		}
		n, err := b.InFlight(ctx, "k")
		return err == nil && n == 1
	}, 15*time.Second, 20*time.Millisecond, "the holder's lease put back in the new database")
	assert.Zero(t, admitted, "admissions of the other process while the key's one slot was held")

	held.Release()
	require.Eventually(t, func() bool {
		s, err := b.TryAcquire("k")
		if err == nil {
			s.Release()
		}
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "the other process admitted once the holder released")
	assert.False(t, a.StoreUnavailable())
	assert.False(t, b.StoreUnavailable())
}

// A database that answers without the schema, which the store's role may
// not make again, fails Ping: the fleet holds it unavailable, rather than
// reachable with every call failing.
func TestPingWithoutSchema(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.Migrate(ctx, owner))
	s, err := pgstore.New(ctx, gatewayRole(t, srv, owner), "least")
	require.NoError(t, err)
	require.NoError(t, s.Ping(ctx))

	_, err = owner.Exec(ctx, `DROP SCHEMA public CASCADE; CREATE SCHEMA public;
		REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT USAGE ON SCHEMA public TO gateway`)
	require.NoError(t, err)
	assert.Error(t, s.Ping(ctx))

	require.NoError(t, pgstore.Migrate(ctx, owner))
	_, err = owner.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO gateway;
		GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO gateway`)
	require.NoError(t, err)
	assert.NoError(t, s.Ping(ctx), "the schema back")
}
