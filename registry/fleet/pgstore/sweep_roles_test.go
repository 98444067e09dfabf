package pgstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// rolePool returns a pool on srv as role, closed at cleanup.
func rolePool(t *testing.T, srv *pgtest.Server, role string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), strings.Replace(srv.URL, "inflight@", role+"@", 1))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// renewals makes n renewals of fleet f on p, holding nothing, each with
// a sweep of its own (Renew's are not told), and returns the first error.
func renewals(t *testing.T, p *pgxpool.Pool, n int) error {
	t.Helper()
	s, err := pgstore.New(context.Background(), p, "f")
	require.NoError(t, err)
	for range n {
		if _, err := s.Renew(context.Background(), &driver.RenewCall{TTL: fastTTL}); err != nil {
			return err
		}
		if _, err := p.Exec(context.Background(), "SELECT inflight_sweep_keys('f')"); err != nil {
			return err
		}
	}
	return nil
}

// The fleet's role made the schema (a release before) and another role
// (a DBA's) makes revision 13: the owner of inflight_key is granted the
// sweep's tables too. Found by review: only the roles granted inflight_key
// were, and every renewal of the fleet's role was refused.
func TestSweepAfterAnotherRolesMigration(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	admin := pool(t, srv, 2)
	_, err := admin.Exec(ctx, `CREATE ROLE fleetrole LOGIN; GRANT CREATE, USAGE ON SCHEMA public TO fleetrole`)
	require.NoError(t, err)
	p := rolePool(t, srv, "fleetrole")
	require.NoError(t, pgstore.MigrateTo(ctx, p, 12))
	require.NoError(t, pgstore.Migrate(ctx, admin))
	assert.NoError(t, renewals(t, p, 3), "the fleet's role renews after the migration")
	var sweepers int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM inflight_sweeper WHERE fleet = 'f'").Scan(&sweepers))
	assert.Equal(t, 1, sweepers, "and sweeps")
}

// A role that may not delete keys' rows (no release before needed it to)
// renews all the same, and its sweep does nothing and fails nothing.
// Found by review: every renewal was refused.
func TestSweepOfARoleWithoutDelete(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, owner, 12))
	_, err := owner.Exec(ctx, `CREATE ROLE nodelete LOGIN;
		GRANT USAGE ON SCHEMA public TO nodelete;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO nodelete;
		REVOKE DELETE ON inflight_key FROM nodelete;
		GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO nodelete`)
	require.NoError(t, err)
	require.NoError(t, pgstore.Migrate(ctx, owner))
	p := rolePool(t, srv, "nodelete")
	_, err = p.Exec(ctx, "UPDATE inflight_sweeper SET swept = 0") // due at once
	require.NoError(t, err)
	assert.NoError(t, renewals(t, p, 3), "a role without DELETE on inflight_key renews")
}
