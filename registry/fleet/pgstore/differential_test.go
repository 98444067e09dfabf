package pgstore_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/internal/storediff"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A differential check of the PostgreSQL store against memstore, the
// contract written out in Go (package storediff, as redisstore's
// differential test runs it for Redis): the same random driver calls on
// both, their answers, counts and queues compared. PostgreSQL has no fake
// clock: the test replaces inflight_now_us() (every function of the
// schema reads its clock there) with a read of a table of its own, which
// it sets to memstore's clock at each step, so that both stores see the
// same time. One server for each test function; each seed runs in a
// fleet of its own.
//
// Knobs (environment, see storediff): DIFF_SEEDS (4 by default, so that
// the normal suite stays short), DIFF_SEED0, DIFF_MULTI, DIFF_LIGHTMULTI,
// DIFF_SHORT, DIFF_STARTS, DIFF_KEYS, DIFF_CARRY, DIFF_BATCH, DIFF_TRACE
// (log every call of every run), DIFF_NOEPOCH and DIFF_EPOCH.

// pgConfig is where PostgreSQL's side of the runs differs from Redis's
// on purpose (see storediff.Config): its epochs come from the clock it
// shares with memstore, and it takes its fast paths with them; waiters
// settle after a limit changes; a carried pair weighs the lease's own
// units; no release comes first after a loss.
var pgConfig = storediff.Config{Epochs: true, Settle: true, CarryOwnUnits: true, SkipReleaseAfterLoss: true, TooLate: true}

// pgSide is the PostgreSQL store, one fleet of a server, for storediff.
type pgSide struct {
	t     *testing.T
	r     driver.Store
	admin *pgxpool.Pool
	fleet string
}

// pgDiffServer starts a server for a test function, with the clock its
// runs set.
func pgDiffServer(t *testing.T) (*pgtest.Server, *pgxpool.Pool) {
	srv := pgtest.Start(t)
	admin := pool(t, srv, 1)
	ctx := context.Background()
	// The schema first (New migrates it), then the clock replaced.
	_, err := pgstore.New(ctx, admin, "diff-setup")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE TABLE diff_clock (us bigint NOT NULL);
		INSERT INTO diff_clock VALUES (0);
		CREATE OR REPLACE FUNCTION inflight_now_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$ SELECT us FROM diff_clock $$;`)
	require.NoError(t, err)
	return srv, admin
}

func newPgDiff(t *testing.T, srv *pgtest.Server, admin *pgxpool.Pool, fleet string) *storediff.Pair {
	st, err := pgstore.New(context.Background(), pool(t, srv, 2), fleet)
	require.NoError(t, err)
	s := &pgSide{t: t, r: st, admin: admin, fleet: fleet}
	now := time.UnixMilli(1_800_000_000_000)
	p := storediff.New(t, now, s, pgConfig)
	s.SetClock(now, 0)
	if os.Getenv("DIFF_TRACE") != "" {
		t.Cleanup(func() {
			for _, l := range p.Log {
				t.Log(l)
			}
		})
	}
	return p
}

func (s *pgSide) Name() string        { return "pg" }
func (s *pgSide) Store() driver.Store { return s.r }

func (s *pgSide) SetClock(now time.Time, _ time.Duration) {
	_, err := s.admin.Exec(context.Background(), "UPDATE diff_clock SET us = $1", now.UnixMicro())
	require.NoError(s.t, err)
}

// Dump logs the PostgreSQL store's tickets and leases.
func (s *pgSide) Dump() {
	ctx := context.Background()
	for _, q := range []string{
		"SELECT key || ' ' || ticket || ' u=' || units || ' r=' || rank || ' tag=' || tag || ' urgent=' || urgent || ' passed=' || passed_units || ' ' || expires FROM inflight_ticket WHERE fleet = $1 ORDER BY key, rank, tag, seq",
		"SELECT key || ' ' || lease || ' u=' || units || ' ' || expires FROM inflight_lease WHERE fleet = $1 ORDER BY key, lease",
	} {
		rows, err := s.admin.Query(ctx, q, s.fleet)
		if err != nil {
			s.t.Logf("dump: %v", err)
			continue
		}
		for rows.Next() {
			var v string
			_ = rows.Scan(&v)
			s.t.Log("pg ", v)
		}
		rows.Close()
	}
}

// Queued is how many tickets wait in key's queue on PostgreSQL.
func (s *pgSide) Queued(key string) int {
	var n int
	require.NoError(s.t, s.admin.QueryRow(context.Background(), "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = $2",
		s.fleet, pgstore.StoredKey(key)).Scan(&n))
	return n
}

// Leased reports whether lease is on key on PostgreSQL (expired or not).
func (s *pgSide) Leased(key, lease string) bool {
	var n int
	require.NoError(s.t, s.admin.QueryRow(context.Background(), "SELECT count(*) FROM inflight_lease WHERE fleet = $1 AND key = $2 AND lease = $3",
		s.fleet, pgstore.StoredKey(key), lease).Scan(&n))
	return n > 0
}

// Lose deletes the fleet's rows.
func (s *pgSide) Lose() {
	for _, tbl := range []string{"fleet", "marker", "key", "lease", "ticket", "flow", "proc", "tomb"} {
		_, err := s.admin.Exec(context.Background(), "DELETE FROM inflight_"+tbl+" WHERE fleet = $1", s.fleet)
		require.NoError(s.t, err)
	}
}

// TestDifferential drives both stores with the same random calls on
// one or two keys, small queues, waiters of one process that never dies
// (of three that die, with DIFF_SHORT).
func TestDifferential(t *testing.T) {
	srv, admin := pgDiffServer(t)
	multi := storediff.Multi()
	storediff.Seeds(t, 4, func(t *testing.T, seed uint64) {
		storediff.Run(newPgDiff(t, srv, admin, "d"+strconv.FormatUint(seed, 10)), seed, multi)
	})
}

// TestDifferentialRenew drives one key (two for some leases) with
// admissions, renewals (of held and of released leases), expiries and
// losses of the store's data.
func TestDifferentialRenew(t *testing.T) {
	srv, admin := pgDiffServer(t)
	storediff.Seeds(t, 4, func(t *testing.T, seed uint64) {
		storediff.RenewRun(newPgDiff(t, srv, admin, "r"+strconv.FormatUint(seed, 10)), seed)
	})
}

// TestDifferentialBudget drives one budget with charges, corrections and
// moves on both stores.
func TestDifferentialBudget(t *testing.T) {
	srv, admin := pgDiffServer(t)
	storediff.Seeds(t, 4, func(t *testing.T, seed uint64) {
		storediff.BudgetRun(newPgDiff(t, srv, admin, "b"+strconv.FormatUint(seed, 10)), seed)
	})
}
