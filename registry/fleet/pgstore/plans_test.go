package pgstore_test

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Schema revision 5: the store's functions are PL/pgSQL, whose plans a
// connection keeps, but for two that PostgreSQL inlines (a bare
// expression each) and the older signatures kept for the releases before
// revision 2, which call the new ones. Up to PostgreSQL 17 an SQL function
// that cannot be inlined is planned anew in every statement that calls
// it, and every call of the store is a transaction of its own. A database
// that revision 4 left gets six of them replaced, under their own
// signatures.
func TestFunctionsKeepTheirPlans(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 2)
	inSQL := func() []string {
		rows, err := p.Query(ctx, `SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			WHERE l.lanname = 'sql' AND p.proname LIKE 'inflight\_%'`)
		require.NoError(t, err)
		var names []string
		for rows.Next() {
			var name string
			require.NoError(t, rows.Scan(&name))
			names = append(names, name)
		}
		require.NoError(t, rows.Err())
		slices.Sort(names)
		return names
	}
	kept := []string{
		"inflight_channel(text,text)",
		"inflight_now_us()",
		// The signatures of revision 1, as calls of revision 2's functions.
		"inflight_admit(text,text,text[],bigint[],bigint,bigint,bigint,bigint,boolean,boolean,bigint,smallint,text,integer,text,integer,integer,bigint,boolean,text[],text[])",
		"inflight_can_take(text,text,text[],bigint[],text,bigint,bigint,bigint)",
		"inflight_enqueue(text,text[],bigint[],text,smallint,text,integer,text,bigint,bigint)",
		"inflight_grant(text,text[],text,text,bigint,bigint)",
		"inflight_renew(text,bigint,bigint,bigint,bigint,boolean,text[],integer[],bigint[],integer[],text[],bigint[])",
	}
	replaced := []string{
		"inflight_abandoned(text,text,bigint)",
		"inflight_alive(text,text,bigint,bigint)",
		"inflight_current(text,bigint,bigint,bigint,bigint)",
		"inflight_dead(text,text,bigint,bigint)",
		"inflight_earliest(text,text,bigint)",
		"inflight_queued(text,text,bigint)",
	}
	require.NoError(t, pgstore.MigrateTo(ctx, p, 4))
	before := slices.Concat(kept, replaced)
	slices.Sort(before)
	assert.Equal(t, before, inSQL(), "revision 4's SQL functions")
	_, err := pgstore.New(ctx, p, "f")
	require.NoError(t, err)
	slices.Sort(kept)
	assert.Equal(t, kept, inSQL())
	for _, f := range replaced {
		var lang string
		require.NoError(t, p.QueryRow(ctx, `SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			WHERE p.oid = to_regprocedure($1)`, f).Scan(&lang), f)
		assert.Equal(t, "plpgsql", lang, f)
	}
	var r int
	require.NoError(t, p.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&r))
	assert.Equal(t, pgstore.SchemaRevision, r)
}
