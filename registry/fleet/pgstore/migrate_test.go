package pgstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
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
// new database: here its schema emptied) under a fleet of two processes at
// a cap of 1, one of them holding the key: every call fails, Ping too, so
// the fleet holds the store unavailable (FailClosed: the other process is
// refused) rather than reachable with every call failing; the missing
// schema is logged. Once Migrate makes it again, the holder's lease is put
// back before the other process is admitted, and it is admitted once the
// holder releases.
func TestEmptiedDatabase(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	var logs testrig.Buffer
	opts := []fleet.Option{fleet.WithTimeout(2 * time.Second), fleet.WithLeaseTTL(time.Second),
		fleet.WithUnavailable(fleet.FailClosed), fleet.WithBreaker(1, 50*time.Millisecond)}
	a := process(t, srv, "emptied", 1, opts...)
	bStore, err := pgstore.New(ctx, pool(t, srv, 4), "emptied", pgstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	b := fleet.New[string](bStore, 1, opts...)
	t.Cleanup(b.Close)
	held, err := a.TryAcquire("k")
	require.NoError(t, err)
	_, err = b.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached)

	// Emptied in place: the processes' connections stay, so that no
	// connection error (which a failover also brings) hides what follows.
	owner := pool(t, srv, 1)
	_, err = owner.Exec(ctx, "DROP SCHEMA public CASCADE; CREATE SCHEMA public")
	require.NoError(t, err)
	admitted := 0
	try := func() {
		if s, err := b.TryAcquire("k"); err == nil {
			admitted++
			s.Release()
		}
	}
	require.Eventually(t, func() bool { try(); return b.StoreUnavailable() }, 15*time.Second, 20*time.Millisecond,
		"the store held unavailable while its schema is missing")
	assert.Error(t, bStore.Ping(ctx), "Ping while the schema is missing")
	assert.Contains(t, logs.String(), "schema is missing")

	require.NoError(t, pgstore.Migrate(ctx, owner))
	assert.Eventually(t, func() bool {
		try()
		n, err := b.InFlight(ctx, "k")
		return err == nil && n == 1
	}, 15*time.Second, 20*time.Millisecond, "the holder's lease put back in the new schema")
	assert.Zero(t, admitted, "admissions of the other process while the key's one slot was held")

	held.Release()
	require.Eventually(t, func() bool {
		s, err := b.TryAcquire("k")
		if err == nil {
			s.Release()
		}
		return err == nil
	}, 15*time.Second, 20*time.Millisecond, "the other process admitted once the holder released")
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

// Revision 22 makes again the functions that multiply a waiter's units by
// PassFactor, with PassFactor a bigint: on a database at revision 21 as
// the release before left it (PassFactor an int in their bodies), it
// makes each of them as this release's revisions do, and changes nothing
// else.
func TestMigrate21To22MakesTheBoundsBigints(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, p, 21))
	want := functionDefinitions(t, p)
	factor := fmt.Sprint(driver.PassFactor)
	var made []string
	for name, def := range want {
		if strings.Contains(def, factor+"::bigint") {
			made = append(made, name)
			_, err := p.Exec(ctx, strings.ReplaceAll(def, factor+"::bigint", factor))
			require.NoError(t, err)
		}
	}
	assert.ElementsMatch(t, []string{
		"inflight_pass(text,text,inflight_ticket,text,smallint,integer)",
		"inflight_serve(text,text,bigint,bigint,bigint,integer)",
		"inflight_still_queued(text,text,text[],bigint[],bigint,bigint,bigint,bigint,text,bigint)",
	}, made, "the functions whose latest definitions use PassFactor, made as the release before made them")
	require.NoError(t, pgstore.MigrateTo(ctx, p, 22))
	assert.Equal(t, want, functionDefinitions(t, p))
}

// functionDefinitions returns the definition of each of the schema's
// functions (pg_get_functiondef), by signature.
func functionDefinitions(t *testing.T, p *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := p.Query(context.Background(), `SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p
		WHERE p.proname LIKE 'inflight\_%'`)
	require.NoError(t, err)
	out := map[string]string{}
	for rows.Next() {
		var name, def string
		require.NoError(t, rows.Scan(&name, &def))
		out[name] = def
	}
	require.NoError(t, rows.Err())
	return out
}

// A function's definition is taken from a file from its CREATE OR REPLACE
// FUNCTION to the $$; that ends its body, and only if the file has one
// definition of it, with a body in $$.
func TestFunctionFromAFile(t *testing.T) {
	const sql = `-- inflight_serve serves.
CREATE OR REPLACE FUNCTION inflight_serve_one(k text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RETURN 1;
END $$;

CREATE OR REPLACE FUNCTION inflight_serve(k text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RETURN 2; -- $ alone
END $$;

CREATE OR REPLACE FUNCTION inflight_twice(k text) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;
CREATE OR REPLACE FUNCTION inflight_twice(k int) RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;
CREATE OR REPLACE FUNCTION inflight_quoted(k text) RETURNS int LANGUAGE sql AS 'SELECT 1';
CREATE OR REPLACE FUNCTION inflight_open(k text) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$
`
	assert.Equal(t, `CREATE OR REPLACE FUNCTION inflight_serve(k text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RETURN 2; -- $ alone
END $$;`, pgstore.Function(sql, "inflight_serve"))
	assert.Equal(t, `CREATE OR REPLACE FUNCTION inflight_serve_one(k text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RETURN 1;
END $$;`, pgstore.Function(sql, "inflight_serve_one"))
	for _, name := range []string{"inflight_none", "inflight_twice", "inflight_quoted", "inflight_open"} {
		assert.Panics(t, func() { pgstore.Function(sql, name) }, name)
	}
	// An edit changes the one place it names, and panics if there is
	// none, or more than one.
	assert.Equal(t, "BEGIN\n\tRETURN 3;\nEND", pgstore.Edited("BEGIN\n\tRETURN 2;\nEND", "RETURN 2;", "RETURN 3;"))
	assert.Panics(t, func() { pgstore.Edited("RETURN 2;", "RETURN 3;", "RETURN 4;") }, "none")
	assert.Panics(t, func() { pgstore.Edited("RETURN 2; RETURN 2;", "RETURN 2;", "RETURN 4;") }, "two")
}

// A schema that a release before the revisions made (version 1, no
// revision table), for a role granted its tables by their owner, stays
// the role's once the owner migrates it: the tables the revisions add
// are granted to it as inflight_key is (revision 24), so that it reads
// the revision and keeps budgets. Found by a hunt: New failed,
// "permission denied for table inflight_schema_revision", for every
// process of a release that the owner had migrated to; a database the
// release before this one migrated so is mended by this one's Migrate.
func TestNewAfterTheOwnersMigrationFromVersion1(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, owner, 0))
	_, err := owner.Exec(ctx, "DROP TABLE inflight_schema_revision") // as the release before left it
	require.NoError(t, err)
	p := gatewayRole(t, srv, owner)

	require.NoError(t, pgstore.MigrateTo(ctx, owner, 23)) // the release before revision 24
	_, err = pgstore.New(ctx, p, "f")
	require.ErrorContains(t, err, "permission denied for table inflight_schema_revision")
	require.NoError(t, pgstore.Migrate(ctx, owner))
	s, err := pgstore.New(ctx, p, "f")
	require.NoError(t, err)
	res, err := s.Budget(ctx, &driver.BudgetCall{Key: "b", Limits: [3]int64{10}, Cost: [3]int64{4, 4}})
	require.NoError(t, err)
	assert.True(t, res.Charged)
}

// Two replicas that migrate at once, on connections whose transactions
// default to REPEATABLE READ (a role or a connection string set so), into
// an empty database and over a release before's revision: the second
// waits for the first's lock, and must then read the schema the first
// made, not the snapshot it took before the wait. Found by review: it
// found the tables without a version ("put back its row"), or the
// revision before, which it made again and failed to record.
func TestMigrateAtOnceUnderRepeatableRead(t *testing.T) {
	for _, from := range []int{-1, 21} {
		srv := pgtest.Start(t)
		ctx := context.Background()
		holder := pool(t, srv, 2)
		if from >= 0 {
			require.NoError(t, pgstore.MigrateTo(ctx, holder, from))
		}
		conn, err := holder.Acquire(ctx)
		require.NoError(t, err)
		// The migration lock held, so that both replicas begin their
		// transactions before either migrates.
		const lock = 0x696e666c69676874 // migrate.go's migrationLock
		_, err = conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(lock))
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			cfg, err := pgxpool.ParseConfig(srv.URL)
			require.NoError(t, err)
			cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(p.Close)
			wg.Go(func() { errs[i] = pgstore.Migrate(ctx, p) })
		}
		waiting := assert.Eventually(t, func() bool {
			var n int
			err := holder.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&n)
			return err == nil && n == 2
		}, 10*time.Second, 10*time.Millisecond, "both replicas wait for the migration lock (from revision %d)", from)
		_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(lock))
		conn.Release()
		require.NoError(t, err)
		wg.Wait()
		require.True(t, waiting)
		for i, err := range errs {
			assert.NoError(t, err, "replica %d, from revision %d", i, from)
		}
	}
}

// A role that may use the tables but create nothing, on a schema its
// owner has not yet migrated to this release's revision, is refused with
// an error that says so and what to do (ErrNotMigrated), not with the
// first DDL statement's "permission denied for schema public".
func TestNewOnAnOlderRevisionWithoutCreate(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, owner, pgstore.SchemaRevision-1))
	p := gatewayRole(t, srv, owner)

	_, err := pgstore.New(ctx, p, "f")
	require.ErrorIs(t, err, pgstore.ErrNotMigrated)
	assert.Contains(t, err.Error(), "run pgstore.Migrate")
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe, "the database's own error is kept")
	assert.Equal(t, "42501", pe.Code)

	require.NoError(t, pgstore.Migrate(ctx, owner))
	_, err = pgstore.New(ctx, p, "f")
	require.NoError(t, err, "once the owner has migrated it")
}

// A role that may not migrate, which found the schema older and then
// waited for the owner's migration to end, finds it current once it
// holds the lock: New succeeds, where it failed with ErrNotMigrated
// ("missing or older") for a schema already migrated (gateways that start
// while their owner's migration runs, as a rolling deploy has them).
func TestNewWaitingForTheOwnersMigration(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1) // one connection: the one that holds the lock
	require.NoError(t, pgstore.MigrateTo(ctx, owner, pgstore.SchemaRevision-1))
	p := gatewayRole(t, srv, owner)
	const lock = 0x696e666c69676874 // migrate.go's migrationLock
	_, err := owner.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(lock))
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { _, err := pgstore.New(ctx, p, "f"); done <- err }()
	require.Eventually(t, func() bool {
		var n int
		err := owner.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the gateway waits for the migration lock")
	// The owner migrates on the connection that holds the lock, then lets it go.
	require.NoError(t, pgstore.Migrate(ctx, owner))
	_, err = owner.Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(lock))
	require.NoError(t, err)
	assert.NoError(t, <-done, "the schema is current by the time the gateway holds the lock")
}
