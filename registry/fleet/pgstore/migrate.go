package pgstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/driver"
)

//go:embed schema.sql
var schemaSQL string

//go:embed budget.sql
var budgetSQL string

//go:embed units.sql
var unitsSQL string

//go:embed asks.sql
var asksSQL string

//go:embed turns.sql
var turnsSQL string

//go:embed plans.sql
var plansSQL string

//go:embed pass.sql
var passSQL string

//go:embed release.sql
var releaseSQL string

//go:embed serve.sql
var serveSQL string

//go:embed count.sql
var countSQL string

//go:embed newcomer.sql
var newcomerSQL string

//go:embed budgetfloor.sql
var budgetFloorSQL string

//go:embed silence.sql
var silenceSQL string

//go:embed sweep.sql
var sweepSQL string

//go:embed paused.sql
var pausedSQL string

//go:embed pausedask.sql
var pausedAskSQL string

//go:embed sweepdenied.sql
var sweepDeniedSQL string

//go:embed serving.sql
var servingSQL string

//go:embed queuedkey.sql
var queuedKeySQL string

//go:embed lookbound.sql
var lookBoundSQL string

//go:embed busykey.sql
var busyKeySQL string

//go:embed resume.sql
var resumeSQL string

//go:embed servereads.sql
var serveReadsSQL string

//go:embed admitreads.sql
var admitReadsSQL string

// withConstants puts the fleet's constants in the schema's text: the
// grants that pass a ticket of several keys over before it is urgent, as
// the local registry counts them, and how turns count units. PassFactor
// is a bigint: it multiplies a waiter's units, an int, and an int times
// an int is an int, which PassFactor times more than 536,870,911 units
// is past (the releases before revision 22 made it an int: see
// bigintBounds).
func withConstants(sql string) string {
	return strings.NewReplacer("{{maxPassed}}", strconv.Itoa(registry.MaxPassed),
		"{{maxTag}}", strconv.FormatFloat(driver.MaxTag, 'f', -1, 64),
		"{{turnSteps}}", strconv.Itoa(driver.TurnSteps), "{{passFactor}}", strconv.Itoa(driver.PassFactor)+"::bigint",
		"{{passScan}}", strconv.Itoa(driver.PassScan)).Replace(sql)
}

// function returns the statement of sql that creates the function name,
// from its CREATE OR REPLACE FUNCTION to the $$; that ends its body (the
// next $$, as PostgreSQL reads it). It panics unless sql creates name once,
// with a body in $$: the texts are the package's own files.
func function(sql, name string) string {
	head := "CREATE OR REPLACE FUNCTION " + name + "("
	if n := strings.Count(sql, head); n != 1 {
		panic(fmt.Sprintf("pgstore: %d definitions of %s in one file", n, name))
	}
	start := strings.Index(sql, head)
	open := strings.Index(sql[start:], "$$")
	if open < 0 || strings.Contains(sql[start:start+open], ";") {
		panic("pgstore: no body in $$ for " + name)
	}
	open += start + 2
	end := strings.Index(sql[open:], "$$;")
	if end < 0 || strings.Index(sql[open:], "$$") != end {
		panic("pgstore: the body of " + name + " does not end with $$;")
	}
	return sql[start : open+end+3]
}

// bigintBounds is revision 22: the functions whose bodies multiply a
// waiter's units by PassFactor made again, from the files that hold their
// latest definitions, with PassFactor a bigint (see withConstants).
// Before it, a call that looked at a heavy waiter of more than
// 536,870,911 units, or granted a waiter of another flow or class of more
// than 268,435,455 past a heavy one (driver.Pass), failed with "integer
// out of range": every release and admission on the key failed until the
// heavy waiter left.
var bigintBounds = withConstants(function(passSQL, "inflight_pass") + "\n\n" +
	function(resumeSQL, "inflight_serve") + "\n\n" + function(queuedKeySQL, "inflight_still_queued"))

// budgetCheck is revision 23: a budget's check (driver.BudgetCall's
// Check). inflight_budget (budgetfloor.sql's) is made again, one line
// changed: move without correct, which no release before this one sends
// (it sends move only with correct), charges nothing and answers as a
// charge of cost that did not fit, at 0 if cost fits now. A client
// refused by a budget's tokens asks so of its requests, to tell when both
// take the request. The function keeps its signature and the meaning of
// the answers the releases before get.
var budgetCheck = edited(function(budgetFloorSQL, "inflight_budget"),
	"\tIF fits THEN\n", "\tIF fits AND NOT move THEN -- move here, without correct, is a check\n")

// edited is sql with old, which it holds once, replaced by new; it panics
// otherwise (the texts are the package's own files).
func edited(sql, old, new string) string {
	if n := strings.Count(sql, old); n != 1 {
		panic(fmt.Sprintf("pgstore: %d places to edit, want one", n))
	}
	return strings.Replace(sql, old, new, 1)
}

// schemaV1 is the schema, with the fleet's constants in it.
var schemaV1 = withConstants(schemaSQL)

// revisions are the additions made to schema version 1 since, each from
// the one before: revision 1 adds the budgets per minute, revision 2 the
// units a lease weighs (replacing the functions that count, serve and
// admit, and keeping the signatures the releases before call), revision 3
// answers a waiter behind a heavy waiter, and a waiter's claim of its
// grant, without the key's lock, revision 4 counts flows' turns in units,
// revision 5 makes the small functions the calls run PL/pgSQL, whose plans
// a connection keeps, revision 6 lets lighter waiters pass a heavy one up
// to a bound, revision 7 serves a key's queue once per release call,
// revision 8 counts a key's units once per serving and again after each
// grant, revision 9 carries the count from grant to grant, and revision 10
// counts a call whose lease has expired as a newcomer when it passes a
// heavy waiter, revision 11 takes no budget's step below zero, revision
// 12 runs a lease's TTL only while the store is heard (the fleet's
// silence, driver.Store), and revision 13 deletes the rows of keys left
// idle, and takes a key's lock in one statement that makes the row again
// if it was deleted meanwhile, revision 14 keeps no place for an urgent
// ticket with a paused key, revision 15 keeps a waiter's place across
// a pause of new admissions, revision 16 counts a sweep that the role
// may not make as made, so that it is tried (and logged) once a sweep
// interval rather than at every renewal, and revision 17 stops serving
// where a waiter it went past needs the room (a heavy waiter passed its
// bound, one of several keys heavy since), counts a waiter's grants once
// its own call has served all of its keys, and takes an abandoned lease
// off every key before serving any, and revision 18 has a queued waiter
// of several keys name the key it waits on (a key whose serving only went
// past a heavy waiter is not kept from it), and revision 19 has a serving
// that goes on past its look bound know the waiters of several keys before
// where it goes on (it stops where one of them is heavy), revision 20
// has a waiter of several keys passed over only for a key another call
// holds keep the room of the key served, and revision 21 has a serving
// that goes on past its look bound go on from the waiter the look before
// it did not reach, wherever it stands now, revision 22 counts a heavy
// waiter's bound in bigints (bigintBounds), revision 23 lets a budget's
// call check when a cost would fit, charging nothing, and revision 24
// grants the tables made without grants (tableGrants), revision 25
// reads less per serving, under the key's lock (servereads.sql), and
// revision 26 reads a key's leases fewer times per admission and per
// queued waiter's ask (admitreads.sql). A revision adds, or replaces a
// function keeping its signature and the meaning of its answers, so a
// release that knows fewer of them works on the schema as it is (a
// rolling deploy has both side by side); one that changes what is there
// makes a new SchemaVersion.
var revisions = []string{budgetSQL, withConstants(unitsSQL), asksSQL, withConstants(turnsSQL), plansSQL, withConstants(passSQL), releaseSQL, withConstants(serveSQL), withConstants(countSQL), newcomerSQL, budgetFloorSQL,
	withConstants(silenceSQL), sweepSQL, withConstants(pausedSQL), withConstants(pausedAskSQL), sweepDeniedSQL,
	withConstants(servingSQL), withConstants(queuedKeySQL), withConstants(lookBoundSQL), withConstants(busyKeySQL),
	withConstants(resumeSQL), bigintBounds, budgetCheck, tableGrants, withConstants(serveReadsSQL),
	withConstants(admitReadsSQL)}

// SchemaVersion is the version of the tables and functions this package
// uses; SchemaRevision, the additions to it it needs.
const (
	SchemaVersion  = 1
	SchemaRevision = 26
)

// ErrSchemaNewer: the database has a newer schema than this package knows
// (a process of an older release in a fleet that a newer one migrated).
var ErrSchemaNewer = errors.New("pgstore: the database's schema is newer than this release's")

// ErrNotMigrated: the database's schema is missing or older than this
// release's and the role may not make or migrate it (the schema's owner
// does, and the processes' role only uses it): the owner runs Migrate
// with this release before its processes start. The database's refusal
// is wrapped beside it.
var ErrNotMigrated = errors.New("pgstore: the database's schema is missing or older than this release's, and this role may not migrate it: " +
	"have the schema's owner run pgstore.Migrate with this release")

// migrationLock is the key of the transaction-level advisory lock that
// serializes migrations: replicas that start at once migrate one after
// another, and each finds the schema made by the first.
const migrationLock = 0x696e666c69676874 // "inflight"

// Migrate brings the database's schema to SchemaVersion, in one
// transaction under an advisory lock, so that any number of processes may
// call it at once; if the schema is there it only reads its version, so a
// role that may not create objects can call it. New calls it.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate(ctx, pool, SchemaRevision)
}

// migrationTries bounds the tries of a migration that a fleet's calls
// keep from its locks (see migrate).
const migrationTries = 10

// migrate is Migrate up to revision (a test makes a database as a
// release before this one left it). A revision that alters a table waits
// for the calls running on it, and the calls of a release before it take
// the tables in either order: so the migration waits at most a second
// for each lock (the fleet's calls wait behind it meanwhile), and is made
// again, after a backoff, if it times out or deadlocks with a call.
func migrate(ctx context.Context, pool *pgxpool.Pool, revision int) error {
	// A schema that is current needs no lock and no DDL: a role that may
	// use the tables but not create any (the schema migrated by its owner)
	// finds it so, where a CREATE ... IF NOT EXISTS would be refused.
	if current, err := schemaCurrent(ctx, pool, revision); err != nil || current {
		return err
	}
	backoff := 50 * time.Millisecond
	for try := 1; ; try++ {
		err := migrateOnce(ctx, pool, revision)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
			// The schema may have been migrated by its owner while this
			// call waited for the lock: a role that may not migrate it
			// finds it current now, as it would have before the wait.
			switch current, cerr := schemaCurrent(ctx, pool, revision); {
			case current:
				return nil
			case errors.Is(cerr, ErrSchemaNewer):
				return cerr
			}
			return fmt.Errorf("%w: %w", ErrNotMigrated, err)
		}
		if err == nil || try == migrationTries || !errors.As(err, &pe) || (pe.Code != "40P01" && pe.Code != "55P03") {
			return err
		}
		t := time.NewTimer(backoff + rand.N(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgstore: migration: %w (after %v)", ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// schemaCurrent reports whether the database's schema is at
// SchemaVersion and at revision or later, reading without DDL; it fails
// with ErrSchemaNewer for a later version.
func schemaCurrent(ctx context.Context, pool *pgxpool.Pool, revision int) (bool, error) {
	var tables bool
	err := pool.QueryRow(ctx, "SELECT to_regclass('inflight_schema') IS NOT NULL AND to_regclass('inflight_schema_revision') IS NOT NULL").Scan(&tables)
	if err != nil || !tables {
		return false, err
	}
	var v, r *int
	err = pool.QueryRow(ctx, "SELECT (SELECT max(version) FROM inflight_schema), (SELECT max(revision) FROM inflight_schema_revision)").Scan(&v, &r)
	switch {
	case err != nil:
		return false, fmt.Errorf("pgstore: schema version: %w", err)
	case v != nil && *v > SchemaVersion:
		return false, fmt.Errorf("%w: %d, this release knows %d", ErrSchemaNewer, *v, SchemaVersion)
	}
	return v != nil && *v == SchemaVersion && r != nil && *r >= revision, nil
}

// migrateOnce is one try of migrate, in one transaction at READ
// COMMITTED whatever the role's default: a migration that waited for
// another's lock must read the schema that one made, where a snapshot
// taken before the wait (REPEATABLE READ, SERIALIZABLE) finds the tables
// without their version, or the revision the other replaced.
func migrateOnce(ctx context.Context, pool *pgxpool.Pool, revision int) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLock)); err != nil {
			return fmt.Errorf("pgstore: migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '1s'"); err != nil {
			return fmt.Errorf("pgstore: migration: %w", err)
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS inflight_schema (version int NOT NULL)"); err != nil {
			return fmt.Errorf("pgstore: schema version table: %w", err)
		}
		var v int
		err := tx.QueryRow(ctx, "SELECT version FROM inflight_schema").Scan(&v)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return fmt.Errorf("pgstore: schema version: %w", err)
		case v > SchemaVersion:
			return fmt.Errorf("%w: %d, this release knows %d", ErrSchemaNewer, v, SchemaVersion)
		case v == SchemaVersion:
			return revise(ctx, tx, revision)
		}
		// No version (or one below 1, which no release wrote): the tables
		// must not be there, or making them would fail on the first one.
		var tables bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass('inflight_fleet') IS NOT NULL").Scan(&tables); err != nil {
			return fmt.Errorf("pgstore: schema: %w", err)
		}
		if tables {
			return errors.New("pgstore: the database has the fleet's tables but inflight_schema has no version " +
				"(its row deleted, or set below 1): put back its row, version 1")
		}
		if _, err := tx.Exec(ctx, schemaV1); err != nil {
			return fmt.Errorf("pgstore: schema %d: %w", SchemaVersion, err)
		}
		if _, err := tx.Exec(ctx, "DELETE FROM inflight_schema"); err != nil {
			return err
		}
		if _, err = tx.Exec(ctx, "INSERT INTO inflight_schema (version) VALUES ($1)", SchemaVersion); err != nil {
			return err
		}
		return revise(ctx, tx, revision)
	})
}

// revise makes the revisions of the schema that it lacks, up to
// revision, under Migrate's lock. The revision is kept in a table of its
// own, which a release that knows none does not read.
func revise(ctx context.Context, tx pgx.Tx, revision int) error {
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS inflight_schema_revision (revision int NOT NULL)"); err != nil {
		return fmt.Errorf("pgstore: schema revision table: %w", err)
	}
	var r int
	err := tx.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&r)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("pgstore: schema revision: %w", err)
	case r >= revision:
		return nil // a later release's additions are no business of this one
	}
	for i := r; i < revision; i++ {
		if _, err := tx.Exec(ctx, revisions[i]); err != nil {
			return fmt.Errorf("pgstore: schema revision %d: %w", i+1, err)
		}
	}
	if _, err := tx.Exec(ctx, "DELETE FROM inflight_schema_revision"); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "INSERT INTO inflight_schema_revision (revision) VALUES ($1)", revision)
	return err
}

// tableGrants is revision 24: the tables made without grants since
// version 1 (the revisions' own, and budget.sql's budgets) are granted
// as sweep.sql grants its tables. A schema that its owner migrates, for
// roles granted the tables there were, refused them what a later release
// reads: New failed ("permission denied for table
// inflight_schema_revision"), then every budget call.
var tableGrants = grantAsKey("inflight_schema_revision", "SELECT") + ";\n" +
	grantAsKey("inflight_budget", "SELECT", "INSERT", "UPDATE", "DELETE")

// grantAsKey is a statement that grants table to the roles inflight_key
// is granted to, with those of privileges that they have on inflight_key.
func grantAsKey(table string, privileges ...string) string {
	return `DO $$
DECLARE
	g record;
BEGIN
	FOR g IN SELECT DISTINCT a.grantee, a.privilege_type FROM pg_class c,
		aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
		WHERE c.oid = 'inflight_key'::regclass AND a.grantee <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
		AND a.privilege_type IN ('` + strings.Join(privileges, "', '") + `') LOOP
		EXECUTE format('GRANT %s ON ` + table + ` TO %s', g.privilege_type,
			CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END);
	END LOOP;
END $$`
}
