package pgstore_test

import (
	"context"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Schema revision 5: no SQL function that the store calls reads or writes
// a table. PostgreSQL plans such a function again in every transaction
// that calls it (it inlines only a bare expression), and every call of the
// store is a transaction of its own; a PL/pgSQL function's plans are kept
// by the connection. (The older signatures kept for the releases before,
// which call the new ones, are left as they are.) A database that revision
// 4 left gets them replaced.
func TestFunctionsKeepTheirPlans(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 2)
	usesTable := regexp.MustCompile(`(?i)\b(FROM|INTO|UPDATE)\s+inflight_`)
	planned := func() []string {
		rows, err := p.Query(ctx, `SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			WHERE l.lanname = 'sql' AND p.proname LIKE 'inflight\_%' AND NOT EXISTS (SELECT 1 FROM pg_proc n
				JOIN pg_language nl ON nl.oid = n.prolang WHERE n.proname = p.proname AND nl.lanname = 'plpgsql')`)
		require.NoError(t, err)
		var names []string
		for rows.Next() {
			var name, body string
			require.NoError(t, rows.Scan(&name, &body))
			if usesTable.MatchString(body) {
				names = append(names, name)
			}
		}
		require.NoError(t, rows.Err())
		slices.Sort(names)
		return names
	}
	require.NoError(t, pgstore.MigrateTo(ctx, p, 4))
	assert.Equal(t, []string{"inflight_abandoned", "inflight_alive", "inflight_current", "inflight_dead", "inflight_earliest", "inflight_queued"},
		planned(), "revision 4's SQL functions that use a table")
	s, err := pgstore.New(ctx, p, "f")
	require.NoError(t, err)
	assert.Empty(t, planned())
	var r int
	require.NoError(t, p.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&r))
	assert.Equal(t, 5, r)
	// The store's calls work on the replaced functions (the conformance
	// suite runs them all).
	require.NoError(t, s.Ping(ctx))
}
