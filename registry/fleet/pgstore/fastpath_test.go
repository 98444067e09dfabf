package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// The fast path of a waiter that asks again (inflight_still_queued) and
// the grants left out of an admission's counts, call by call on the store.

const (
	fastFleet = "fast"
	fastTTL   = time.Minute
	fastClaim = 20 * time.Second // a grant outlives the test's steps
	fastLive  = 2 * time.Minute  // beyond 1.5 claim windows: no waiter is taken for dead
)

// fastStore returns the fleet's store on a server of its own, and a pool
// of the test's own on it.
func fastStore(t *testing.T) (driver.Store, *pgxpool.Pool) {
	t.Helper()
	srv := pgtest.Start(t)
	return store(t, srv, fastFleet), pool(t, srv, 2)
}

// kcall is an admission of id on "k" under limit by process "p", shaped
// as the fleet client makes it (a Pause asked, so the store knows the
// callers' TTL: the fast path needs it).
func kcall(id string, limit int, wait bool) *driver.AdmitCall {
	return &driver.AdmitCall{Lease: id, Keys: []string{"k"}, Limits: []int{limit}, TTL: fastTTL, Pause: fastTTL, Wait: wait,
		Claim: fastClaim, Live: fastLive, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1}
}

// admitIn makes c within d and requires it to succeed.
func admitIn(t *testing.T, s driver.Store, c *driver.AdmitCall, d time.Duration) driver.AdmitResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	r, err := s.AdmitOne(ctx, c)
	require.NoError(t, err, "admission of %s", c.Lease)
	return r
}

// holdKey locks "k"'s row in inflight_key in a transaction of its own, on
// the test's pool, as a call on the key that takes its time would; the
// returned func rolls it back (also at cleanup).
func holdKey(t *testing.T, admin *pgxpool.Pool) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1 FROM inflight_key WHERE fleet = $1 AND key = 'k' FOR UPDATE", fastFleet).Scan(&one),
		"the key's row is there and locked")
	return func() { require.NoError(t, tx.Rollback(ctx)) }
}

// requireBlocked makes c within d (short), and requires it to fail for
// the deadline: it waited for the key's lock.
func requireBlocked(t *testing.T, s driver.Store, c *driver.AdmitCall, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	r, err := s.AdmitOne(ctx, c)
	require.Error(t, err, "%s's call waits for the key's lock (got status %d)", c.Lease, r.Status)
	t.Logf("%s's call, blocked: %v", c.Lease, err)
	var pgErr *pgconn.PgError
	assert.True(t, errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || errors.As(err, &pgErr) && pgErr.Code == "57014",
		"%s's call ended by its deadline, not otherwise: %v", c.Lease, err)
	assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}

// ticketExpires reads the expiry of ticket's place on "k".
func ticketExpires(t *testing.T, admin *pgxpool.Pool, ticket string) int64 {
	t.Helper()
	var exp int64
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT expires FROM inflight_ticket WHERE fleet = $1 AND key = 'k' AND ticket = $2",
		fastFleet, ticket).Scan(&exp))
	return exp
}

// A waiter that asks again while it is queued on a full key is answered
// without the key's lock: with the key's row locked by another
// transaction, W's ask comes back queued (its place's and its process's
// expiries renewed from the reply's clock), while a newcomer's call waits
// for the lock.
func TestQueuedAskDoesNotWaitForTheKey(t *testing.T) {
	s, admin := fastStore(t)
	ra := admitIn(t, s, kcall("A", 1, false), 10*time.Second)
	require.Equal(t, driver.StatusAdmitted, ra.Status)
	w := kcall("W", 1, true)
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)
	require.NotZero(t, rw.Epoch)
	assert.Equal(t, rw.Now+3*fastTTL.Milliseconds(), ticketExpires(t, admin, "W"), "queued until 3 TTLs on")

	unlock := holdKey(t, admin)
	w.Epoch = rw.Epoch // the fast path needs the caller to know the fleet's epoch
	again := admitIn(t, s, w, 5*time.Second)
	assert.Equal(t, driver.StatusQueued, again.Status)
	assert.Equal(t, 0, again.Key)
	assert.Equal(t, int64(1), again.Count, "A's lease")
	assert.Equal(t, int64(1), again.Queue, "W, counted")
	assert.Equal(t, rw.Epoch, again.Epoch)
	assert.Equal(t, ra.Now+fastTTL.Milliseconds(), again.Earliest, "A's expiry")
	assert.GreaterOrEqual(t, again.Now, rw.Now)
	assert.Equal(t, again.Now+3*fastTTL.Milliseconds(), ticketExpires(t, admin, "W"), "the ask renewed W's place")
	var alive int64
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT alive_until FROM inflight_proc WHERE fleet = $1 AND proc = 'p'",
		fastFleet).Scan(&alive))
	assert.Equal(t, again.Now+fastLive.Milliseconds(), alive, "the ask renewed p's liveness")

	// The lock is held indeed, and a newcomer waits for it.
	n := kcall("N", 1, true)
	n.Epoch = rw.Epoch
	requireBlocked(t, s, n, 300*time.Millisecond)
	unlock()
}

// The fast path answers only a ticket that cannot be admitted: a key with
// room sends the ask through the key's lock, where it is served. Here the
// limit is raised in W's ask: while the key's row is locked, the ask with
// the old limit is answered at once and the one with the raised limit
// waits; once the lock is gone, the latter admits W.
func TestQueuedAskWithRaisedLimitTakesTheLock(t *testing.T) {
	s, admin := fastStore(t)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("A", 1, false), 10*time.Second).Status)
	w := kcall("W", 1, true)
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)
	w.Epoch = rw.Epoch

	unlock := holdKey(t, admin)
	assert.Equal(t, driver.StatusQueued, admitIn(t, s, w, 5*time.Second).Status, "full: answered without the lock")
	raised := *w
	raised.Limits = []int{2}
	requireBlocked(t, s, &raised, 300*time.Millisecond)
	unlock()

	r := admitIn(t, s, &raised, 10*time.Second)
	assert.Equal(t, driver.StatusAdmitted, r.Status, "room under the raised limit: W is served")
	n, err := s.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "A and W")
}

// The same when the room comes from a lease that expired: W, queued
// behind A (a TTL of a second), asks again until it is admitted. Every ask
// answered queued came before A's expiry on the store's clock, and the
// admission after it: the fast path does not keep a waiter queued on a
// key whose leases have expired.
func TestQueuedAskAfterExpiryTakesTheLock(t *testing.T) {
	s, _ := fastStore(t)
	a := kcall("A", 1, false)
	a.TTL = time.Second // W must queue before it expires: two calls in a row
	ra := admitIn(t, s, a, 10*time.Second)
	require.Equal(t, driver.StatusAdmitted, ra.Status)
	aExpires := ra.Now + a.TTL.Milliseconds()
	w := kcall("W", 1, true)
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status, "queued behind A (its lease expires at %d, now %d)", aExpires, rw.Now)
	w.Epoch = rw.Epoch

	tick := time.NewTicker(10 * time.Millisecond) // a waiter asking again, as its client would
	defer tick.Stop()
	deadline := time.Now().Add(30 * time.Second)
	asks := 0
	for {
		r := admitIn(t, s, w, 10*time.Second)
		asks++
		if r.Status == driver.StatusAdmitted {
			assert.GreaterOrEqual(t, r.Now, aExpires, "admitted once A's lease expired")
			break
		}
		require.Equal(t, driver.StatusQueued, r.Status)
		require.Less(t, r.Now, aExpires, "queued only while A's lease holds the key")
		require.True(t, time.Now().Before(deadline), "W still queued %d asks after A's lease expired", asks)
		<-tick.C
	}
	t.Logf("admitted at the %d-th ask", asks)
	n, err := s.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "W alone")
}

// An admission's Counts (the evidence of a learned cap) leave out a grant
// its waiter has not claimed yet, which Count includes: its request is
// not at the upstream yet. Once claimed, it is counted.
func TestCountsLeaveOutGrants(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("A", 2, false), 10*time.Second).Status)
	x := kcall("X", 2, false)
	x.Starts = true
	rx := admitIn(t, s, x, 10*time.Second)
	require.Equal(t, driver.StatusAdmitted, rx.Status)
	assert.Equal(t, []int64{2}, rx.Counts, "A and X")
	rw := admitIn(t, s, kcall("W", 2, true), 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)

	// X's release hands its place to W: a grant, not claimed yet.
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "X", Limit: 2}}}))
	var granted bool
	require.NoError(t, admin.QueryRow(ctx, "SELECT granted FROM inflight_lease WHERE fleet = $1 AND key = 'k' AND lease = 'W'", fastFleet).Scan(&granted))
	assert.True(t, granted, "W's grant")
	n, err := s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "A and W's grant")

	nc := kcall("N", 3, false)
	nc.Starts, nc.Epoch = true, rw.Epoch
	rn := admitIn(t, s, nc, 10*time.Second)
	require.Equal(t, driver.StatusAdmitted, rn.Status)
	assert.Equal(t, []int64{2}, rn.Counts, "A and N: W's grant is left out")
	n, err = s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 3, n, "A, W's grant and N")

	// W claims its grant (under the limit raised, as N's).
	wc := kcall("W", 3, true)
	wc.Starts, wc.Epoch = true, rw.Epoch
	rc := admitIn(t, s, wc, 10*time.Second)
	require.Equal(t, driver.StatusAdmitted, rc.Status)
	assert.Equal(t, []int64{3}, rc.Counts, "A, N and W, claimed")
	require.NoError(t, admin.QueryRow(ctx, "SELECT granted FROM inflight_lease WHERE fleet = $1 AND key = 'k' AND lease = 'W'", fastFleet).Scan(&granted))
	assert.False(t, granted, "claimed")
}

// The answer without the key's lock is for a ticket queued on full keys
// in a settled fleet alone: any other ask takes the lock, as it may have
// to settle something. Each case below changes one thing and finds the
// ask waiting for the held lock; between the cases the fast path answers
// again (so each fallback is the case's doing).
func TestQueuedAskFallsBack(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("A", 1, false), 10*time.Second).Status)
	w := kcall("W", 1, true)
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)
	w.Epoch = rw.Epoch
	exec := func(sql string, args ...any) {
		_, err := admin.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	fast := func(c *driver.AdmitCall) {
		t.Helper()
		unlock := holdKey(t, admin)
		defer unlock()
		assert.Equal(t, driver.StatusQueued, admitIn(t, s, c, 10*time.Second).Status, "answered beside the held lock")
	}
	fast(w)

	with := func(change func(c *driver.AdmitCall)) *driver.AdmitCall {
		c := *w
		change(&c)
		return &c
	}
	cases := []struct {
		name  string
		setup func() (undo func())
		call  *driver.AdmitCall
	}{
		{"another epoch known", nil, with(func(c *driver.AdmitCall) { c.Epoch = rw.Epoch - 1 })},
		{"no epoch known", nil, with(func(c *driver.AdmitCall) { c.Epoch = 0 })},
		{"a longer pause asked", nil, with(func(c *driver.AdmitCall) { c.Pause = 2 * fastTTL })},
		{"a longer TTL", nil, with(func(c *driver.AdmitCall) { c.TTL = 2 * fastTTL; c.Pause = 2 * fastTTL })},
		{"leases carried", nil, with(func(c *driver.AdmitCall) { c.Carried = []driver.Pair{{Key: "k", Lease: "Z"}} })},
		{"its process not alive", func() func() {
			exec("UPDATE inflight_proc SET alive_until = 0 WHERE fleet = $1", fastFleet)
			return func() {}
		}, w},
		{"a pause declared", func() func() {
			exec("UPDATE inflight_fleet SET pause_until = $2 WHERE fleet = $1", fastFleet, time.Now().Add(time.Hour).UnixMilli())
			return func() { exec("UPDATE inflight_fleet SET pause_until = 0 WHERE fleet = $1", fastFleet) }
		}, w},
		{"the epoch's marker gone", func() func() {
			exec("DELETE FROM inflight_marker WHERE fleet = $1", fastFleet)
			return func() {}
		}, w},
	}
	for _, c := range cases {
		undo := func() {}
		if c.setup != nil {
			undo = c.setup()
		}
		unlock := holdKey(t, admin)
		requireBlocked(t, s, c.call, 300*time.Millisecond)
		unlock()
		undo()
		// The locked path settles it (a new epoch, liveness); then W is
		// answered without the lock again. A lost marker is a new epoch,
		// which the store pauses: the test ends the pause.
		r := admitIn(t, s, w, 10*time.Second)
		if r.Status == driver.StatusPaused {
			w.Epoch = r.Epoch // the new one: known, it pauses nothing more
			exec("UPDATE inflight_fleet SET pause_until = 0 WHERE fleet = $1", fastFleet)
			r = admitIn(t, s, w, 10*time.Second)
		}
		if r.Epoch != 0 {
			w.Epoch, rw.Epoch = r.Epoch, r.Epoch
		}
		require.Equal(t, driver.StatusQueued, r.Status, "after %s", c.name)
		fast(w)
	}
}

// A fleet whose callers ask for no pause after a loss (so the store knows
// no TTL of theirs) has its queued asks answered without the lock too.
func TestQueuedAskWithoutPause(t *testing.T) {
	s, admin := fastStore(t)
	noPause := func(id string, wait bool) *driver.AdmitCall {
		c := kcall(id, 1, wait)
		c.Pause = 0
		return c
	}
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, noPause("A", false), 10*time.Second).Status)
	w := noPause("W", true)
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)
	w.Epoch = rw.Epoch
	unlock := holdKey(t, admin)
	defer unlock()
	assert.Equal(t, driver.StatusQueued, admitIn(t, s, w, 10*time.Second).Status, "answered beside the held lock")
}
