package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Schema revision 3: a waiter behind a heavy waiter, and a waiter that
// claims its grant, are answered without the key's lock; whatever else
// may be due still takes it.

// heavyAhead queues H (3 units, process "q") behind A's 2 units on "k"
// (limit 4), counts its bound passed (passH), then queues L (1 unit,
// process "p"), for which the key has room but H is first; it returns L's
// call, knowing the fleet's epoch.
func heavyAhead(t *testing.T, s driver.Store, admin *pgxpool.Pool) (l *driver.AdmitCall) {
	t.Helper()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("A", 2, 4, false), 10*time.Second).Status)
	h := ucall("H", 3, 4, true)
	h.Proc = "q"
	rh := admitIn(t, s, h, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rh.Status, "2 + 3 over 4")
	passH(t, admin, 3*driver.PassFactor) // so it keeps the room
	l = ucall("L", 1, 4, true)
	require.Equal(t, driver.StatusQueued, admitIn(t, s, l, 10*time.Second).Status, "2 + 1 fits, but H is first")
	l.Epoch = rh.Epoch
	return l
}

// passH sets the units counted as passed heavy waiter H to n (as if
// lighter waiters had passed it): at its bound, it keeps the room.
func passH(t *testing.T, admin *pgxpool.Pool, n int) {
	t.Helper()
	_, err := admin.Exec(context.Background(), "UPDATE inflight_ticket SET passed_units = $2 WHERE fleet = $1 AND ticket = 'H'", fastFleet, n)
	require.NoError(t, err)
}

// A light waiter's ask, while a heavy waiter at the head of the key's
// queue keeps the room it would fit in, is answered without the key's
// lock (H's own ask too: the key has no room for its units); once the
// lock is gone, the whole path answers the same: the heavy waiter keeps
// the room.
func TestAskBehindAHeavyWaiter(t *testing.T) {
	s, admin := fastStore(t)
	l := heavyAhead(t, s, admin)

	unlock := holdKey(t, admin)
	again := admitIn(t, s, l, 5*time.Second)
	assert.Equal(t, driver.StatusQueued, again.Status, "answered beside the held lock")
	assert.Equal(t, int64(2), again.Count, "A's 2 units")
	assert.Equal(t, again.Now+3*fastTTL.Milliseconds(), ticketExpires(t, admin, "L"), "the ask renewed L's place")
	unlock()
	rl := admitIn(t, s, l, 10*time.Second)
	assert.Equal(t, driver.StatusQueued, rl.Status, "kept for H")
	countIs(t, s, "k", 2, "the 2 free units stand idle")
}

// The fast path judges the heavy waiter as serving does, and takes the
// key's lock where serving would not stop at it: its ticket expired, its
// process not known alive, it is under its bound of units passed, or a
// limit, as the asking caller has it, that
// lets its units in or is under them. Each time, once the lock is gone, L's ask through
// the whole path is what serving decides.
func TestAskBehindAHeavyWaiterTakesTheLock(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, admin *pgxpool.Pool, l *driver.AdmitCall)
		after  driver.Status // L's status through the whole path
		count  int           // "k"'s count then
	}{
		{"its ticket expired", func(t *testing.T, admin *pgxpool.Pool, _ *driver.AdmitCall) {
			_, err := admin.Exec(ctx, "UPDATE inflight_ticket SET expires = 0 WHERE fleet = $1 AND ticket = 'H'", fastFleet)
			require.NoError(t, err)
		}, driver.StatusAdmitted, 3}, // H dropped, L served
		{"its process not known alive", func(t *testing.T, admin *pgxpool.Pool, _ *driver.AdmitCall) {
			_, err := admin.Exec(ctx, "UPDATE inflight_proc SET alive_until = inflight_now_us() / 1000 + 1000 WHERE fleet = $1 AND proc = 'q'", fastFleet)
			require.NoError(t, err)
		}, driver.StatusAdmitted, 3}, // dead by the claim window: H dropped, L served
		{"it may still be passed", func(t *testing.T, admin *pgxpool.Pool, _ *driver.AdmitCall) {
			passH(t, admin, 0)
		}, driver.StatusAdmitted, 3}, // L passes H (revision 6)
		{"a raised limit lets it in", func(_ *testing.T, _ *pgxpool.Pool, l *driver.AdmitCall) {
			l.Limits = []int{6}
		}, driver.StatusAdmitted, 6}, // H granted, then L
		{"a lowered limit is under its units", func(t *testing.T, admin *pgxpool.Pool, l *driver.AdmitCall) {
			_, err := admin.Exec(ctx, "UPDATE inflight_lease SET units = 1 WHERE fleet = $1 AND lease = 'A'", fastFleet)
			require.NoError(t, err)
			l.Limits = []int{2} // room for L's unit beside A's; H's 3 over it
		}, driver.StatusAdmitted, 2}, // H passed over (its process refuses it), L served
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, admin := fastStore(t)
			l := heavyAhead(t, s, admin)
			tc.change(t, admin, l)
			unlock := holdKey(t, admin)
			requireBlocked(t, s, l, 300*time.Millisecond)
			unlock()
			assert.Equal(t, tc.after, admitIn(t, s, l, 10*time.Second).Status)
			countIs(t, s, "k", tc.count, "after L's ask")
		})
	}
}

// grantedW admits A on keys (limit 1 each), queues W behind it, and
// releases A, which grants W; it returns W's call, knowing the fleet's
// epoch.
func grantedW(t *testing.T, s driver.Store, admin *pgxpool.Pool, keys ...string) *driver.AdmitCall {
	t.Helper()
	ctx := context.Background()
	limits := make([]int, len(keys))
	var pairs []driver.Release
	for i, k := range keys {
		limits[i] = 1
		pairs = append(pairs, driver.Release{Key: k, Lease: "A", Limit: 1})
	}
	a := kcall("A", 1, false)
	a.Keys, a.Limits = keys, limits
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, a, 10*time.Second).Status)
	w := kcall("W", 1, true)
	w.Keys, w.Limits = keys, limits
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)
	w.Epoch = rw.Epoch
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: pairs}))
	var granted int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM inflight_lease WHERE fleet = $1 AND lease = 'W' AND granted", fastFleet).Scan(&granted))
	require.Equal(t, len(keys), granted, "the release granted W on each key")
	return w
}

// A waiter granted by a release's serving claims its grant without the
// keys' locks: with "k"'s row locked by another transaction, W's claim
// (on "k" alone, and on "j" and "k") is admitted, its lease held for the
// TTL and counted as started; a newcomer's call still waits for the lock.
func TestClaimDoesNotWaitForTheKey(t *testing.T) {
	for _, keys := range [][]string{{"k"}, {"k", "j"}} {
		t.Run(fmt.Sprint(keys), func(t *testing.T) {
			s, admin := fastStore(t)
			ctx := context.Background()
			w := grantedW(t, s, admin, keys...)
			w.Starts = true

			unlock := holdKey(t, admin)
			r := admitIn(t, s, w, 5*time.Second)
			assert.Equal(t, driver.StatusAdmitted, r.Status, "claimed beside the held lock")
			assert.Equal(t, w.Epoch, r.Epoch)
			assert.Len(t, r.Counts, len(keys))
			for _, c := range r.Counts {
				assert.Equal(t, int64(1), c, "W's lease, started")
			}
			rows, err := admin.Query(ctx, "SELECT expires, granted FROM inflight_lease WHERE fleet = $1 AND lease = 'W'", fastFleet)
			require.NoError(t, err)
			n := 0
			for rows.Next() {
				var expires int64
				var granted bool
				require.NoError(t, rows.Scan(&expires, &granted))
				assert.False(t, granted, "claimed")
				assert.Equal(t, r.Now+fastTTL.Milliseconds(), expires, "held for the TTL from the claim")
				n++
			}
			require.NoError(t, rows.Err())
			assert.Equal(t, len(keys), n)
			newcomer := kcall("N", 1, true)
			newcomer.Epoch = w.Epoch
			requireBlocked(t, s, newcomer, 300*time.Millisecond)
			unlock()
			countIs(t, s, "k", 1, "W")
		})
	}
}

// A claim takes the key's lock when its grant cannot simply be taken: an
// abandoned lease (the whole path refuses it and frees its grant), or a
// grant that expired (it is dropped, and its waiter queued again).
func TestClaimTakesTheLock(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, admin *pgxpool.Pool)
		after  driver.Status
	}{
		{"abandoned", func(t *testing.T, admin *pgxpool.Pool) {
			_, err := admin.Exec(ctx, "INSERT INTO inflight_tomb (fleet, lease, until) VALUES ($1, 'W', inflight_now_us() / 1000 + 60000)", fastFleet)
			require.NoError(t, err)
		}, driver.StatusAbandoned},
		{"its grant expired", func(t *testing.T, admin *pgxpool.Pool) {
			_, err := admin.Exec(ctx, "UPDATE inflight_lease SET expires = 0 WHERE fleet = $1 AND lease = 'W'", fastFleet)
			require.NoError(t, err)
		}, driver.StatusAdmitted}, // the key is free again: W is admitted through the whole path
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, admin := fastStore(t)
			w := grantedW(t, s, admin, "k")
			tc.change(t, admin)
			unlock := holdKey(t, admin)
			requireBlocked(t, s, w, 300*time.Millisecond)
			unlock()
			assert.Equal(t, tc.after, admitIn(t, s, w, 10*time.Second).Status)
		})
	}
}

// lockWaiters counts the server's backends waiting for a lock.
func lockWaiters(t *testing.T, admin *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").Scan(&n))
	return n
}

// A claim whose grant expired, queued for the key behind a release that
// deletes expired leases, does not hold the grant's row meanwhile (the
// claim locked its row, then waited for the key, and the release waited
// for the row: a deadlock the server broke after a second, failing the
// claim). Both calls end well.
func TestExpiredClaimBehindARelease(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	w := grantedW(t, s, admin, "k")
	x := kcall("X", 1, true) // a waiter, so that the release serves the key
	x.Epoch = w.Epoch
	require.Equal(t, driver.StatusQueued, admitIn(t, s, x, 10*time.Second).Status)
	_, err := admin.Exec(ctx, "UPDATE inflight_lease SET expires = inflight_now_us() / 1000 - 1 WHERE fleet = $1 AND lease = 'W'", fastFleet)
	require.NoError(t, err)

	unlock := holdKey(t, admin) // a call on "k" under way
	call := func(f func(context.Context) error) chan error {
		done := make(chan error, 1)
		go func() {
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			done <- f(c)
		}()
		return done
	}
	released := call(func(c context.Context) error {
		return s.Release(c, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "gone", Limit: 1}}})
	})
	require.Eventually(t, func() bool { return lockWaiters(t, admin) == 1 }, 10*time.Second, 5*time.Millisecond, "the release waits for the key")
	claimed := call(func(c context.Context) error { _, err := s.AdmitOne(c, w); return err })
	require.Eventually(t, func() bool { return lockWaiters(t, admin) == 2 }, 10*time.Second, 5*time.Millisecond, "the claim waits for the key too")
	unlock()
	assert.NoError(t, <-released)
	assert.NoError(t, <-claimed)
}

// A claim past its not-after time is refused as late, its grant left as
// it was; one from a caller that knew an epoch before the store's declares
// the pause, as the whole path does, and is admitted (step 6 before step
// 7 of driver.AdmitCall), while a newcomer is paused.
func TestClaimLateOrFromAnotherEpoch(t *testing.T) {
	t.Run("late", func(t *testing.T) {
		s, admin := fastStore(t)
		w := grantedW(t, s, admin, "k")
		var now int64
		require.NoError(t, admin.QueryRow(context.Background(), "SELECT inflight_now_us() / 1000").Scan(&now))
		w.NotAfter = now - 1
		assert.Equal(t, driver.StatusTooLate, admitIn(t, s, w, 10*time.Second).Status)
		var granted bool
		require.NoError(t, admin.QueryRow(context.Background(), "SELECT granted FROM inflight_lease WHERE fleet = $1 AND lease = 'W'", fastFleet).Scan(&granted))
		assert.True(t, granted, "the grant is left to its claim in time")
	})
	t.Run("another epoch", func(t *testing.T) {
		s, admin := fastStore(t)
		w := grantedW(t, s, admin, "k")
		epoch := w.Epoch
		w.Epoch = epoch - 1
		assert.Equal(t, driver.StatusAdmitted, admitIn(t, s, w, 10*time.Second).Status)
		n := kcall("N", 5, false)
		n.Epoch = epoch
		assert.Equal(t, driver.StatusPaused, admitIn(t, s, n, 10*time.Second).Status)
	})
}

// A process of the release before revision 3 (it calls inflight_admit
// for every admission, its claims included) works on beside this one once
// this one has migrated: its waiter, queued at revision 2, is granted by
// this release's release and claims the grant through the whole path; its
// ask behind a heavy waiter is answered without the key's lock, as this
// release's are.
func TestRevision2ProcessAfterRevision3(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	old := pool(t, srv, 2)
	require.NoError(t, pgstore.MigrateTo(ctx, old, 2))
	admit := func(ctx context.Context, lease string, units, limit int, wait bool, epoch int64) []int64 { // revision 2's call, as its store made it
		t.Helper()
		var res []int64
		require.NoError(t, old.QueryRow(ctx, `SELECT inflight_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)`,
			fastFleet, lease, []string{"k"}, []int64{int64(limit)}, fastTTL.Milliseconds(), int64(0), epoch, fastTTL.Milliseconds(), wait, false,
			fastClaim.Milliseconds(), int16(0), "", 1, "old", -1, -1, fastLive.Milliseconds(), true, []string(nil), []string(nil),
			int32(units), []int32(nil)).Scan(&res), "revision 2's admission of %s", lease)
		require.GreaterOrEqual(t, len(res), 7)
		return res
	}
	require.Equal(t, int64(driver.StatusAdmitted), admit(ctx, "A", 1, 1, false, 0)[0])
	rw := admit(ctx, "W", 1, 1, true, 0)
	require.Equal(t, int64(driver.StatusQueued), rw[0])
	epoch := rw[5]

	s := store(t, srv, fastFleet) // this release: migrates to revision 3
	var revision int
	require.NoError(t, old.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&revision))
	require.Equal(t, pgstore.SchemaRevision, revision)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "A", Limit: 1}}}))
	assert.Equal(t, int64(driver.StatusAdmitted), admit(ctx, "W", 1, 1, true, epoch)[0], "W claims its grant")
	countIs(t, s, "k", 1, "W")

	// H (3 units, this release) waits behind W under a limit of 3, passed
	// up to its bound; L (1 unit, the old release) fits beside W but
	// stands behind H.
	h := ucall("H", 3, 3, true)
	h.Proc, h.Epoch = "q", epoch
	require.Equal(t, driver.StatusQueued, admitIn(t, s, h, 10*time.Second).Status)
	passH(t, old, 3*driver.PassFactor) // it keeps the room (revision 6)
	require.Equal(t, int64(driver.StatusQueued), admit(ctx, "L", 1, 3, true, epoch)[0])
	unlock := holdKey(t, pool(t, srv, 1))
	c, cancel := context.WithTimeout(ctx, 5*time.Second) // answered beside the held lock
	defer cancel()
	assert.Equal(t, int64(driver.StatusQueued), admit(c, "L", 1, 3, true, epoch)[0])
	unlock()
}

// A light waiter's ask beside a heavy waiter it may still pass is not
// answered "queued" without serving: once a lease expires and frees room
// it fits, its own ask takes it (revision 6), with nobody else calling.
func TestAskPassesAHeavyWaiterOnceRoomFrees(t *testing.T) {
	s, _ := fastStore(t)
	a := ucall("A", 3, 4, false)
	a.TTL = 1500 * time.Millisecond
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, a, 10*time.Second).Status)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("B", 1, 4, false), 10*time.Second).Status)
	require.Equal(t, driver.StatusQueued, admitIn(t, s, ucall("H", 4, 4, true), 10*time.Second).Status)
	l := ucall("L", 1, 4, true)
	rl := admitIn(t, s, l, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rl.Status, "no room yet")
	l.Epoch = rl.Epoch
	require.Eventually(t, func() bool {
		return admitIn(t, s, l, 10*time.Second).Status == driver.StatusAdmitted
	}, 10*time.Second, 50*time.Millisecond, "A's lease expired: L passes H")
}
