package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Schema revision 3: a waiter behind a heavy waiter, and a waiter that
// claims its grant, are answered without the key's lock; whatever else
// may be due still takes it.

// heavyAhead queues H (3 units, process "q") behind A's 2 units on "k"
// (limit 4), then L (1 unit, process "p"), for which the key has room but
// H is first; it returns L's call, knowing the fleet's epoch.
func heavyAhead(t *testing.T, s driver.Store) (l *driver.AdmitCall) {
	t.Helper()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("A", 2, 4, false), 10*time.Second).Status)
	h := ucall("H", 3, 4, true)
	h.Proc = "q"
	rh := admitIn(t, s, h, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rh.Status, "2 + 3 over 4")
	l = ucall("L", 1, 4, true)
	require.Equal(t, driver.StatusQueued, admitIn(t, s, l, 10*time.Second).Status, "2 + 1 fits, but H is first")
	l.Epoch = rh.Epoch
	return l
}

// A light waiter's ask, while a heavy waiter at the head of the key's
// queue keeps the room it would fit in, is answered without the key's
// lock (H's own ask too: the key has no room for its units); once the
// lock is gone, the whole path answers the same: the heavy waiter keeps
// the room.
func TestAskBehindAHeavyWaiter(t *testing.T) {
	s, admin := fastStore(t)
	l := heavyAhead(t, s)

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
// process not known alive, or a limit, as the asking caller has it, that
// lets its units in. Each time, once the lock is gone, L's ask through
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
		{"a raised limit lets it in", func(_ *testing.T, _ *pgxpool.Pool, l *driver.AdmitCall) {
			l.Limits = []int{6}
		}, driver.StatusAdmitted, 6}, // H granted, then L
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, admin := fastStore(t)
			l := heavyAhead(t, s)
			tc.change(t, admin, l)
			unlock := holdKey(t, admin)
			requireBlocked(t, s, l, 300*time.Millisecond)
			unlock()
			assert.Equal(t, tc.after, admitIn(t, s, l, 10*time.Second).Status)
			countIs(t, s, "k", tc.count, "after L's ask")
		})
	}
}

// A waiter granted by a release's serving claims its grant without the
// key's lock: with the key's row locked by another transaction, W's claim
// is admitted, its lease held for the TTL and counted as started; a
// newcomer's call still waits for the lock.
func TestClaimDoesNotWaitForTheKey(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("A", 1, false), 10*time.Second).Status)
	w := kcall("W", 1, true)
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)
	w.Epoch = rw.Epoch
	w.Starts = true
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "A", Limit: 1}}}))
	var granted bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT granted FROM inflight_lease WHERE fleet = $1 AND key = 'k' AND lease = 'W'", fastFleet).Scan(&granted))
	require.True(t, granted, "the release granted W")

	unlock := holdKey(t, admin)
	r := admitIn(t, s, w, 5*time.Second)
	assert.Equal(t, driver.StatusAdmitted, r.Status, "claimed beside the held lock")
	assert.Equal(t, rw.Epoch, r.Epoch)
	assert.Equal(t, []int64{1}, r.Counts, "W's lease, started")
	var expires int64
	require.NoError(t, admin.QueryRow(ctx, "SELECT expires, granted FROM inflight_lease WHERE fleet = $1 AND key = 'k' AND lease = 'W'",
		fastFleet).Scan(&expires, &granted))
	assert.False(t, granted, "claimed")
	assert.Equal(t, r.Now+fastTTL.Milliseconds(), expires, "held for the TTL from the claim")
	n := kcall("N", 1, true)
	n.Epoch = rw.Epoch
	requireBlocked(t, s, n, 300*time.Millisecond)
	unlock()
	countIs(t, s, "k", 1, "W")
}

// A claim takes the key's lock when its grant cannot simply be taken: an
// abandoned lease (the whole path refuses it and frees its grant), or a
// grant that expired (it is dropped, and its waiter queued again).
func TestClaimTakesTheLock(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, s driver.Store, admin *pgxpool.Pool)
		after  driver.Status
	}{
		{"abandoned", func(t *testing.T, s driver.Store, admin *pgxpool.Pool) {
			_, err := admin.Exec(ctx, "INSERT INTO inflight_tomb (fleet, lease, until) VALUES ($1, 'W', inflight_now_us() / 1000 + 60000)", fastFleet)
			require.NoError(t, err)
		}, driver.StatusAbandoned},
		{"its grant expired", func(t *testing.T, s driver.Store, admin *pgxpool.Pool) {
			_, err := admin.Exec(ctx, "UPDATE inflight_lease SET expires = 0 WHERE fleet = $1 AND lease = 'W'", fastFleet)
			require.NoError(t, err)
		}, driver.StatusAdmitted}, // the key is free again: W is admitted through the whole path
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, admin := fastStore(t)
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("A", 1, false), 10*time.Second).Status)
			w := kcall("W", 1, true)
			rw := admitIn(t, s, w, 10*time.Second)
			require.Equal(t, driver.StatusQueued, rw.Status)
			w.Epoch = rw.Epoch
			require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "A", Limit: 1}}}))
			tc.change(t, s, admin)
			unlock := holdKey(t, admin)
			requireBlocked(t, s, w, 300*time.Millisecond)
			unlock()
			assert.Equal(t, tc.after, admitIn(t, s, w, 10*time.Second).Status)
		})
	}
}
