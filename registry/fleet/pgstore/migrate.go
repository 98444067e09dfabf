package pgstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inflight-go/inflight/registry"
)

//go:embed schema.sql
var schemaSQL string

//go:embed budget.sql
var budgetSQL string

// schemaV1 is the schema, with the fleet's constants in it: the grants
// that pass a ticket of several keys over before it is urgent, as the
// local registry counts them.
var schemaV1 = strings.ReplaceAll(schemaSQL, "{{maxPassed}}", strconv.Itoa(registry.MaxPassed))

// revisions are the additions made to schema version 1 since, each from
// the one before: revision 1 adds the budgets per minute. A revision only
// adds, so a release that knows fewer of them works on the schema as it
// is (a rolling deploy has both side by side); one that changes what is
// there makes a new SchemaVersion.
var revisions = []string{budgetSQL}

// SchemaVersion is the version of the tables and functions this package
// uses; SchemaRevision, the additions to it it needs.
const (
	SchemaVersion  = 1
	SchemaRevision = 1
)

// ErrSchemaNewer: the database has a newer schema than this package knows
// (a process of an older release in a fleet that a newer one migrated).
var ErrSchemaNewer = errors.New("pgstore: the database's schema is newer than this release's")

// migrationLock is the key of the transaction-level advisory lock that
// serializes migrations: replicas that start at once migrate one after
// another, and each finds the schema made by the first.
const migrationLock = 0x696e666c69676874 // "inflight"

// Migrate brings the database's schema to SchemaVersion, in one
// transaction under an advisory lock, so that any number of processes may
// call it at once; it does nothing if the schema is there. New calls it.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLock)); err != nil {
			return fmt.Errorf("pgstore: migration lock: %w", err)
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
			return revise(ctx, tx)
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
		return revise(ctx, tx)
	})
}

// revise makes the revisions of the schema that it lacks, under Migrate's
// lock. The revision is kept in a table of its own, which a release that
// knows none does not read.
func revise(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS inflight_schema_revision (revision int NOT NULL)"); err != nil {
		return fmt.Errorf("pgstore: schema revision table: %w", err)
	}
	var r int
	err := tx.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&r)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("pgstore: schema revision: %w", err)
	case r >= SchemaRevision:
		return nil // a later release's additions are no business of this one
	}
	for i := r; i < SchemaRevision; i++ {
		if _, err := tx.Exec(ctx, revisions[i]); err != nil {
			return fmt.Errorf("pgstore: schema revision %d: %w", i+1, err)
		}
	}
	if _, err := tx.Exec(ctx, "DELETE FROM inflight_schema_revision"); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "INSERT INTO inflight_schema_revision (revision) VALUES ($1)", SchemaRevision)
	return err
}
