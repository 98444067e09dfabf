package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// The rows of keys left idle (schema revision 13, sweep.sql), and the
// lock every call takes while they are deleted.

const sweepFleet = "sweep"

// scall is an admission of id on key under limit by process "p" that
// does not wait, shaped as the fleet client makes it.
func scall(id, key string, limit int) *driver.AdmitCall {
	return &driver.AdmitCall{Lease: id, Keys: []string{key}, Limits: []int{limit}, TTL: fastTTL, Claim: fastClaim,
		Live: fastLive, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1}
}

// keyRows counts the fleet's rows in inflight_key that match where (a
// condition on the row, x).
func keyRows(t *testing.T, admin *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(),
		"SELECT count(*) FROM inflight_key x WHERE x.fleet = $1 AND "+where, sweepFleet).Scan(&n))
	return n
}

// until calls cond on the test's goroutine (so cond may use require)
// every 10 ms until it holds, for a minute at most.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "%s, within a minute", what)
		<-tick.C
	}
}

// marks counts the fleet's marks of idle keys in inflight_idle that match
// where (a condition on the mark, i).
func marks(t *testing.T, admin *pgxpool.Pool, where string) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(),
		"SELECT count(*) FROM inflight_idle i WHERE i.fleet = $1 AND "+where, sweepFleet).Scan(&n))
	return n
}

// A gateway with a cap per API key makes a row per key it has seen: the
// rows of keys used once and left idle are deleted by the sweep that
// renewals run (here those of a process that holds nothing), first marked
// idle, then deleted when still so ten minutes later, a bounded batch at a
// time. A key held, one with a waiter queued, and one found in use since
// its mark keep their rows; a key whose row is gone works as a new one.
func TestSweepDeletesIdleKeys(t *testing.T) {
	srv := pgtest.Start(t)
	s, admin := store(t, srv, sweepFleet), pool(t, srv, 2)
	ctx := context.Background()
	admit := func(c *driver.AdmitCall, want driver.Status) {
		t.Helper()
		r := admitIn(t, s, c, 10*time.Second)
		require.Equal(t, want, r.Status, "%s on %s", c.Lease, c.Keys[0])
	}
	release := func(key, lease string) {
		t.Helper()
		require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
			Pairs: []driver.Release{{Key: key, Lease: lease, Limit: 1}}}))
	}
	const idle = 300 // more than a sweep looks at (256)
	for i := range idle {
		key := fmt.Sprintf("api-key-%03d", i)
		admit(scall("L"+key, key, 1), driver.StatusAdmitted)
		release(key, "L"+key)
	}
	admit(scall("H", "held", 1), driver.StatusAdmitted)
	admit(scall("Q1", "queued", 1), driver.StatusAdmitted)
	waiter := scall("Q2", "queued", 1)
	waiter.Wait = true
	admit(waiter, driver.StatusQueued)
	require.Equal(t, idle+2, keyRows(t, admin, "true"))

	renew := func() {
		t.Helper()
		_, err := s.Renew(ctx, &driver.RenewCall{TTL: fastTTL})
		require.NoError(t, err)
	}
	until(t, "every idle key marked", func() bool { renew(); return marks(t, admin, "true") == idle })
	assert.Zero(t, marks(t, admin, "i.key IN ('held', 'queued')"), "keys in use are not marked")

	// In use when a sweep looks at it again: its ten minutes start again.
	admit(scall("again", "api-key-000", 1), driver.StatusAdmitted)
	until(t, "the mark of a key found in use dropped", func() bool {
		renew()
		return marks(t, admin, "i.key = 'api-key-000'") == 0
	})
	release("api-key-000", "again")
	// Ten minutes on, for the marks (the database's clock is not the
	// test's to move).
	_, err := admin.Exec(ctx, "UPDATE inflight_idle SET since = since - 600000 WHERE fleet = $1", sweepFleet)
	require.NoError(t, err)
	until(t, "the rows of the keys idle ten minutes deleted", func() bool { renew(); return keyRows(t, admin, "true") == 3 })
	assert.Equal(t, 3, keyRows(t, admin, "x.key IN ('held', 'queued', 'api-key-000')"), "what is left")
	assert.Zero(t, marks(t, admin, "i.key <> 'api-key-000'"), "the marks of the keys deleted, deleted with them")

	n, err := s.Count(ctx, "held")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the held key's lease")
	var queued int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = 'queued'", sweepFleet).Scan(&queued))
	assert.Equal(t, 1, queued, "the waiter's ticket")
	release("queued", "Q1")
	var granted bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT granted FROM inflight_lease WHERE fleet = $1 AND key = 'queued' AND lease = 'Q2'",
		sweepFleet).Scan(&granted), "the waiter granted by the release")
	assert.True(t, granted)

	admit(scall("new", "api-key-001", 1), driver.StatusAdmitted)
	admit(scall("second", "api-key-001", 1), driver.StatusFull)
	assert.Equal(t, 1, keyRows(t, admin, "x.key = 'api-key-001'"), "the key's row made again")
}

// A database at revision 12, whose key rows the release before made, is
// brought to revision 13 by its owner, after the gateway's role was
// granted the tables there were: the new tables are granted to it alike.
// A process of this release then sweeps under that role (after its
// renewals), the release before's rows among the others, while the
// release before's calls go on, and take a key whose row was deleted
// anew.
func TestMigrateSweepFromRevision12(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, owner, 12))
	old := oldRelease{t: t, p: gatewayRole(t, srv, owner), fleet: sweepFleet}
	require.Equal(t, int64(driver.StatusAdmitted), old.admit("h", "held", 1, false)[0])
	require.Equal(t, int64(driver.StatusAdmitted), old.admit("o", "idle", 1, false)[0])
	old.release("o", "idle", 1)

	require.NoError(t, pgstore.Migrate(ctx, owner))
	var revision int
	require.NoError(t, owner.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&revision))
	require.Equal(t, pgstore.SchemaRevision, revision)
	s, err := pgstore.New(ctx, old.p, sweepFleet) // this release's process, under the gateway's role
	require.NoError(t, err)
	renew := func() {
		require.Equal(t, driver.FateRenewed, old.renew("h", "held", 1))
		_, err := s.Renew(ctx, &driver.RenewCall{TTL: fastTTL})
		require.NoError(t, err)
	}
	until(t, "the idle key marked after a renewal of this release", func() bool {
		renew()
		return marks(t, owner, "i.key = 'idle'") == 1
	})
	assert.Zero(t, marks(t, owner, "i.key = 'held'"))
	_, err = owner.Exec(ctx, "UPDATE inflight_idle SET since = since - 600000 WHERE fleet = $1", sweepFleet)
	require.NoError(t, err)
	until(t, "the idle key's row deleted", func() bool {
		renew()
		return keyRows(t, owner, "true") == 1
	})
	assert.Equal(t, 1, keyRows(t, owner, "x.key = 'held'"))
	assert.Equal(t, int64(driver.StatusAdmitted), old.admit("n", "idle", 1, false)[0])
	assert.Equal(t, int64(driver.StatusFull), old.admit("m", "idle", 1, false)[0])
	assert.Equal(t, 1, keyRows(t, owner, "x.key = 'idle'"), "the row made again")
}

// A call on a key whose row is deleted while the call locks it (the
// sweep's transaction holds the row, deletes it, and commits while the
// calls wait for it) takes the row anew: of the calls on a cap of 1 that
// waited, one is admitted, under the lock of the row it made. Before
// revision 13 the lock skipped the deleted row and every call went on
// holding nothing: several were admitted, and no row was left.
func TestLockTakesADeletedRow(t *testing.T) {
	srv := pgtest.Start(t)
	s, admin := store(t, srv, sweepFleet), pool(t, srv, 2)
	ctx := context.Background()
	r := admitIn(t, s, scall("first", "k", 1), 10*time.Second)
	require.Equal(t, driver.StatusAdmitted, r.Status)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "k", Lease: "first", Limit: 1}}}))

	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SELECT 1 FROM inflight_key WHERE fleet = $1 AND key = 'k' FOR UPDATE", sweepFleet)
	require.NoError(t, err)
	tag, err := tx.Exec(ctx, "DELETE FROM inflight_key WHERE fleet = $1 AND key = 'k'", sweepFleet)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())

	const calls = 6
	statuses := make([]driver.Status, calls)
	errs := make([]error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			var r driver.AdmitResult
			r, errs[i] = s.AdmitOne(ctx, scall(fmt.Sprintf("L%d", i), "k", 1))
			statuses[i] = r.Status
		})
	}
	// Each call waits for the deleting transaction: on the row's lock, or
	// to know whether the row it would insert is there.
	until(t, "the calls wait for the deleting transaction", func() bool {
		var waiting int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%inflight_admit%'`).Scan(&waiting))
		return waiting == calls
	})
	require.NoError(t, tx.Commit(ctx))
	wg.Wait()

	admitted := 0
	for i := range calls {
		require.NoError(t, errs[i])
		if statuses[i] == driver.StatusAdmitted {
			admitted++
		} else {
			assert.Equal(t, driver.StatusFull, statuses[i])
		}
	}
	assert.Equal(t, 1, admitted, "calls admitted on a cap of 1")
	assert.Equal(t, 1, keyRows(t, admin, "x.key = 'k'"), "the key's row made again by the call that held it")
	n, err := s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}

// Admissions and releases on keys whose rows the sweep deletes meanwhile
// (called here as often as it can be, its clock ten minutes on at each
// call so that every mark is due) never take a key over its cap of 1,
// counted in the test as each admission is handed out and again by the
// store while the slot is held.
func TestSweepHammer(t *testing.T) {
	srv := pgtest.Start(t)
	s, admin := store(t, srv, sweepFleet), pool(t, srv, 2)
	ctx := context.Background()
	const keys, workers, rounds = 12, 6, 150
	var inFlight [keys]atomic.Int32
	var over, overStore, admitted atomic.Int64
	done := make(chan struct{})
	var sweeps, deleted int
	var sweeper sync.WaitGroup
	sweeper.Go(func() {
		var now, rows int64
		if !assert.NoError(t, admin.QueryRow(ctx, "SELECT inflight_now_us() / 1000").Scan(&now)) {
			return
		}
		for {
			select {
			case <-done:
				return
			default:
			}
			now += 601000
			var after int64
			_, err := admin.Exec(ctx, "SELECT inflight_sweep($1, $2)", sweepFleet, now)
			if err == nil {
				err = admin.QueryRow(ctx, "SELECT count(*) FROM inflight_key WHERE fleet = $1", sweepFleet).Scan(&after)
			}
			if !assert.NoError(t, err) {
				return
			}
			sweeps++
			if after < rows {
				deleted += int(rows - after)
			}
			rows = after
		}
	})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := (w*7 + i*5) % keys
				key := fmt.Sprintf("k%d", k)
				lease := fmt.Sprintf("w%d-%d", w, i)
				r, err := s.AdmitOne(ctx, scall(lease, key, 1))
				if !assert.NoError(t, err) {
					return
				}
				if r.Status != driver.StatusAdmitted {
					continue
				}
				admitted.Add(1)
				if inFlight[k].Add(1) > 1 {
					over.Add(1)
				}
				if n, err := s.Count(ctx, key); assert.NoError(t, err) && n > 1 {
					overStore.Add(1)
				}
				inFlight[k].Add(-1)
				assert.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
					Pairs: []driver.Release{{Key: key, Lease: lease, Limit: 1}}}))
			}
		})
	}
	wg.Wait()
	close(done)
	sweeper.Wait()
	t.Logf("%d admissions, %d sweeps, %d rows seen deleted", admitted.Load(), sweeps, deleted)
	assert.Zero(t, over.Load(), "admissions handed out over a key's cap of 1")
	assert.Zero(t, overStore.Load(), "counts over a key's cap of 1 while a slot was held")
	assert.Positive(t, admitted.Load())
	assert.Positive(t, deleted, "rows the sweep deleted meanwhile")
}
