package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Schema revision 12: a lease's TTL runs only while the store is heard
// (driver.Store). The silence is made by setting heard, and the leases'
// expiries, on the store's clock: TTL/2 is 30 s (fastTTL), TTL/16 3.75 s.

// dbNow is the store's clock, ms.
func dbNow(t *testing.T, admin *pgxpool.Pool) int64 {
	t.Helper()
	var now int64
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT inflight_now_us() / 1000").Scan(&now))
	return now
}

// setHeard sets the fleet's heard to now + d on the store's clock.
func setHeard(t *testing.T, admin *pgxpool.Pool, fleet string, d time.Duration) {
	t.Helper()
	tag, err := admin.Exec(context.Background(), "UPDATE inflight_fleet SET heard = inflight_now_us() / 1000 + $2 WHERE fleet = $1",
		fleet, d.Milliseconds())
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected(), "the fleet's row")
}

// heard is the fleet's heard (0: none).
func heard(t *testing.T, admin *pgxpool.Pool, fleet string) int64 {
	t.Helper()
	var h *int64
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT heard FROM inflight_fleet WHERE fleet = $1", fleet).Scan(&h))
	if h == nil {
		return 0
	}
	return *h
}

// setExpires sets lease's expiry to now + d on the store's clock, on
// every key.
func setExpires(t *testing.T, admin *pgxpool.Pool, fleet, lease string, d time.Duration) {
	t.Helper()
	tag, err := admin.Exec(context.Background(), "UPDATE inflight_lease SET expires = inflight_now_us() / 1000 + $3 WHERE fleet = $1 AND lease = $2",
		fleet, lease, d.Milliseconds())
	require.NoError(t, err)
	require.Positive(t, tag.RowsAffected(), "%s's lease", lease)
}

// leaseLeft is how long lease has left on key on the store's clock (ms;
// absent: a large negative number).
func leaseLeft(t *testing.T, admin *pgxpool.Pool, fleet, key, lease string) int64 {
	t.Helper()
	var left int64
	require.NoError(t, admin.QueryRow(context.Background(), `SELECT coalesce((SELECT expires FROM inflight_lease
		WHERE fleet = $1 AND key = $2 AND lease = $3), -1e15) - inflight_now_us() / 1000`, fleet, key, lease).Scan(&left))
	return left
}

func renewal(lease, key string, limit int, mode driver.Mode) *driver.RenewCall {
	return &driver.RenewCall{TTL: fastTTL, Pause: fastTTL, Leases: []driver.Renewal{{Lease: lease, Mode: mode, Keys: []string{key}, Limits: []int{limit}}}}
}

// onKey is kcall on key.
func onKey(id, key string, limit int, wait bool) *driver.AdmitCall {
	c := kcall(id, limit, wait)
	c.Keys = []string{key}
	return c
}

// After a silence (nothing heard for 40 s, more than TTL/2), whichever
// call with a TTL comes first makes the holder's lease, which expired 5 s
// ago (after heard), last a TTL from now: a newcomer on its key, capped at
// 1, is refused, and the holder's renewal finds it (FateRenewed). The
// first call is on the key itself (an admission) or on another one (a
// renewal, a release or an abandon with its TTL, a waiter's ask and a
// waiter's claim, which the store answers without the keys' locks when
// the store was heard, and takes the whole path after a silence). Heard is
// now after it.
func TestSilenceKeepsLeases(t *testing.T) {
	ctx := context.Background()
	for _, first := range []string{"admission", "renewal", "release", "abandon", "ask", "claim"} {
		t.Run(first, func(t *testing.T) {
			s, admin := fastStore(t)
			// h holds "j" alone; o holds "k", where w waits.
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("h", "j", 1, false), 10*time.Second).Status)
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("o", 1, false), 10*time.Second).Status)
			w := kcall("w", 1, true)
			rw := admitIn(t, s, w, 10*time.Second)
			require.Equal(t, driver.StatusQueued, rw.Status)
			w.Epoch = rw.Epoch
			if first == "claim" { // o released without a TTL: w granted
				require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "o", Limit: 1}}}))
				require.Greater(t, leaseLeft(t, admin, fastFleet, "k", "w"), int64(0), "w's grant")
			}
			setHeard(t, admin, fastFleet, -40*time.Second)
			setExpires(t, admin, fastFleet, "h", -5*time.Second)
			countIs(t, s, "j", 0, "h's lease past its expiry on the store's clock (a count finds no silence)")

			switch first {
			case "admission":
				r := admitIn(t, s, onKey("n", "j", 1, false), 10*time.Second)
				assert.Equal(t, driver.StatusFull, r.Status, "the newcomer, first after the silence")
				assert.Equal(t, int64(1), r.Count)
			case "renewal":
				res, err := s.Renew(ctx, renewal("o", "k", 1, driver.ModeReport))
				require.NoError(t, err)
				assert.Equal(t, []driver.Fate{driver.FateRenewed}, res.Leases)
			case "release":
				require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
					Pairs: []driver.Release{{Key: "k", Lease: "o", Limit: 1}}}))
			case "abandon":
				errs, err := s.Abandon(ctx, []*driver.AbandonCall{{Lease: "o", Keys: []string{"k"}, Limits: []int{1}, TTL: fastTTL, Claim: fastClaim}})
				require.NoError(t, err)
				require.NoError(t, errs[0])
			case "ask":
				// Through the key's lock: an ask answered without it would
				// make the leases last nothing.
				unlock := holdKey(t, admin)
				requireBlocked(t, s, w, 300*time.Millisecond)
				unlock()
				assert.Equal(t, driver.StatusQueued, admitIn(t, s, w, 10*time.Second).Status)
			case "claim":
				assert.Equal(t, driver.StatusAdmitted, admitIn(t, s, w, 10*time.Second).Status, "w claims its grant")
			}

			assert.InDelta(t, dbNow(t, admin), heard(t, admin, fastFleet), 5000, "heard is now")
			assert.Greater(t, leaseLeft(t, admin, fastFleet, "j", "h"), (fastTTL - 10*time.Second).Milliseconds(),
				"h's lease lasts a TTL from the end of the silence")
			countIs(t, s, "j", 1, "h")
			r := admitIn(t, s, onKey("n2", "j", 1, false), 10*time.Second)
			assert.Equal(t, driver.StatusFull, r.Status, "a newcomer after the first call")
			res, err := s.Renew(ctx, renewal("h", "j", 1, driver.ModeReport))
			require.NoError(t, err)
			assert.Equal(t, []driver.Fate{driver.FateRenewed}, res.Leases, "the holder renews its lease")
		})
	}
}

// No silence: the store heard within TTL/2 (10 s ago), or heard is ahead
// of the store's clock (a clock stepped back 10 min). A lease past its
// expiry is dropped as before: a newcomer takes its key, and its holder's
// renewal finds it gone. Heard is now after either.
func TestNoSilenceLetsLeasesExpire(t *testing.T) {
	ctx := context.Background()
	for name, at := range map[string]time.Duration{"heard recently": -10 * time.Second, "clock stepped back": 10 * time.Minute} {
		t.Run(name, func(t *testing.T) {
			s, admin := fastStore(t)
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("h", "j", 1, false), 10*time.Second).Status)
			setHeard(t, admin, fastFleet, at)
			setExpires(t, admin, fastFleet, "h", -5*time.Second)
			assert.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("n", "j", 1, false), 10*time.Second).Status,
				"the newcomer takes the expired lease's room")
			res, err := s.Renew(ctx, renewal("h", "j", 1, driver.ModeReport))
			require.NoError(t, err)
			assert.Equal(t, []driver.Fate{driver.FateGone}, res.Leases, "h's lease expired")
			assert.InDelta(t, dbNow(t, admin), heard(t, admin, fastFleet), 5000, "heard is now")
		})
	}
}

// A release without a TTL (as the release before this revision calls
// inflight_release) finds no silence and writes no heard: serving drops
// the lease past its expiry, and grants its room and the released one's
// to the two waiters. With its TTL, the lease lasts, and only the
// released room is granted.
func TestReleaseWithoutTTLFindsNoSilence(t *testing.T) {
	ctx := context.Background()
	for _, ttl := range []time.Duration{0, fastTTL} {
		t.Run(ttl.String(), func(t *testing.T) {
			s, admin := fastStore(t)
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("h", 2, false), 10*time.Second).Status)
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("o", 2, false), 10*time.Second).Status)
			require.Equal(t, driver.StatusQueued, admitIn(t, s, kcall("w1", 2, true), 10*time.Second).Status)
			require.Equal(t, driver.StatusQueued, admitIn(t, s, kcall("w2", 2, true), 10*time.Second).Status)
			setHeard(t, admin, fastFleet, -40*time.Second)
			before := heard(t, admin, fastFleet)
			setExpires(t, admin, fastFleet, "h", -5*time.Second)
			require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: ttl, Claim: fastClaim,
				Pairs: []driver.Release{{Key: "k", Lease: "o", Limit: 2}}}))
			granted := func(lease string) bool { return leaseLeft(t, admin, fastFleet, "k", lease) > 0 }
			if ttl == 0 {
				assert.False(t, granted("h"), "h's lease dropped")
				assert.True(t, granted("w1") && granted("w2"), "both waiters granted")
				assert.Equal(t, before, heard(t, admin, fastFleet), "heard unchanged")
				return
			}
			assert.True(t, granted("h"), "h's lease lasts")
			assert.True(t, granted("w1") && !granted("w2"), "w1 granted o's room, w2 waits")
			assert.InDelta(t, dbNow(t, admin), heard(t, admin, fastFleet), 5000, "heard is now")
		})
	}
}

// Heard is written once it is more than TTL/16 (3.75 s) old, not by every
// call, and only forward: a call 1 s after it leaves it as it is, one 10 s
// after it (an admission, a renewal, a waiter's ask answered without the
// key's lock) writes it. One whose clock is 10 s behind it (read before
// another call's, and stalled since, or a clock stepped back less than a
// TTL) leaves it, and one 10 min behind (a clock stepped back far) writes
// it.
func TestHeardWrittenCoarsely(t *testing.T) {
	ctx := context.Background()
	s, admin := fastStore(t)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("h", 1, false), 10*time.Second).Status)
	w := kcall("w", 1, true)
	rw := admitIn(t, s, w, 10*time.Second)
	require.Equal(t, driver.StatusQueued, rw.Status)
	w.Epoch = rw.Epoch
	calls := map[string]func(){
		"admission": func() { admitIn(t, s, kcall("n", 1, false), 10*time.Second) },
		"renewal": func() {
			_, err := s.Renew(ctx, renewal("h", "k", 1, driver.ModeReport))
			require.NoError(t, err)
		},
		"ask": func() {
			unlock := holdKey(t, admin) // answered without the key's lock
			defer unlock()
			require.Equal(t, driver.StatusQueued, admitIn(t, s, w, 5*time.Second).Status)
		},
	}
	steps := []struct {
		at      time.Duration // heard, from now
		written bool
	}{{-time.Second, false}, {-10 * time.Second, true}, {10 * time.Second, false}, {10 * time.Minute, true}}
	for name, call := range calls {
		for _, step := range steps {
			setHeard(t, admin, fastFleet, step.at)
			before := heard(t, admin, fastFleet)
			call()
			if step.written {
				assert.InDelta(t, dbNow(t, admin), heard(t, admin, fastFleet), 5000, "%s with heard at %v: heard is now", name, step.at)
			} else {
				assert.Equal(t, before, heard(t, admin, fastFleet), "%s with heard at %v: heard unchanged", name, step.at)
			}
		}
	}
	assert.Greater(t, leaseLeft(t, admin, fastFleet, "k", "h"), int64(0), "h held throughout")
}

// passTime moves the fleet's heard, grace and leases' expiries d back:
// as if d passed on the store's clock with no call.
func passTime(t *testing.T, admin *pgxpool.Pool, fleet string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	_, err := admin.Exec(ctx, `UPDATE inflight_fleet SET heard = heard - $2, grace_from = grace_from - $2, grace_until = grace_until - $2
		WHERE fleet = $1`, fleet, d.Milliseconds())
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "UPDATE inflight_lease SET expires = expires - $2 WHERE fleet = $1", fleet, d.Milliseconds())
	require.NoError(t, err)
}

// Graces that follow one another hold a lease five minutes at most. The
// holder of "d" on "j" dies; the only calls after it are those of a
// process that never lives through a renewal round (a cron job: a
// renewal holding no lease), one each 0.7 TTL (42 s, passed by moving the
// store's times back), each finding a silence. The first makes d's lease
// last a TTL, and so do the next (the second comes right after the first
// grace, inside it) while the chain is within five minutes of its start:
// up to the 7th call, 294 s. The 8th (336 s) leaves it (18 s left), the
// 9th finds it expired, and a newcomer takes its room. The grace over, a
// silence counts afresh: the newcomer's lease lasts across the next.
// Before, each call made d's lease last a TTL more, forever.
func TestGracesBounded(t *testing.T) {
	ctx := context.Background()
	s, admin := fastStore(t)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("d", "j", 1, false), 10*time.Second).Status)
	const step = 42 * time.Second
	cron := func() {
		t.Helper()
		passTime(t, admin, fastFleet, step)
		_, err := s.Renew(ctx, &driver.RenewCall{TTL: fastTTL, Pause: fastTTL})
		require.NoError(t, err)
	}
	for i := 1; i <= 7; i++ {
		cron()
		require.Greater(t, leaseLeft(t, admin, fastFleet, "j", "d"), (fastTTL - 5*time.Second).Milliseconds(),
			"call %d, %v into the chain: d's lease lasts a TTL", i, time.Duration(i)*step)
	}
	cron()
	assert.InDelta(t, (fastTTL - step).Milliseconds(), leaseLeft(t, admin, fastFleet, "j", "d"), 5000,
		"call 8, past five minutes into the chain: d's lease left as it was")
	cron()
	assert.Negative(t, leaseLeft(t, admin, fastFleet, "j", "d"), "call 9: d's lease expired")
	assert.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("n", "j", 1, false), 10*time.Second).Status,
		"a newcomer takes d's room")
	cron()
	assert.Greater(t, leaseLeft(t, admin, fastFleet, "j", "n"), (fastTTL - 5*time.Second).Milliseconds(),
		"a silence after the grace: the newcomer's lease lasts a TTL")
}

// A database at revision 11, with a lease held through the release
// before's calls, is brought to revision 12 by this release's New. Heard
// is missing until a call with a TTL writes it (no silence found then);
// the release before's release (no TTL) works and writes none; and the
// rule holds for both releases' calls after a silence.
func TestMigrateSilenceFromRevision11(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	old := oldRelease{t: t, p: pool(t, srv, 1), fleet: fastFleet}
	require.NoError(t, pgstore.MigrateTo(ctx, old.p, 11))
	var hasHeard bool
	require.NoError(t, old.p.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'inflight_fleet' AND column_name = 'heard')`).Scan(&hasHeard))
	require.False(t, hasHeard, "revision 11 has no heard")
	require.Equal(t, int64(driver.StatusAdmitted), old.admit("h", "j", 1, false)[0])
	require.Equal(t, int64(driver.StatusAdmitted), old.admit("o", "k", 2, false)[0])

	s := store(t, srv, fastFleet) // this release: New migrates
	admin := pool(t, srv, 2)
	var revision int
	require.NoError(t, admin.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&revision))
	assert.Equal(t, pgstore.SchemaRevision, revision)
	assert.Zero(t, heard(t, admin, fastFleet), "no heard before a call with a TTL")
	old.release("o", "k", 2)
	assert.Zero(t, heard(t, admin, fastFleet), "the release before's release carries no TTL")
	assert.Equal(t, driver.FateRenewed, old.renew("h", "j", 1))
	assert.InDelta(t, dbNow(t, admin), heard(t, admin, fastFleet), 5000, "the release before's renewal writes heard")

	setHeard(t, admin, fastFleet, -40*time.Second)
	setExpires(t, admin, fastFleet, "h", -5*time.Second)
	assert.Equal(t, int64(driver.StatusFull), old.admit("n", "j", 1, false)[0], "the release before's newcomer after a silence")
	assert.Greater(t, leaseLeft(t, admin, fastFleet, "j", "h"), (fastTTL - 10*time.Second).Milliseconds())
	setHeard(t, admin, fastFleet, -40*time.Second)
	setExpires(t, admin, fastFleet, "h", -5*time.Second)
	assert.Equal(t, driver.StatusFull, admitIn(t, s, onKey("n", "j", 1, false), 10*time.Second).Status, "this release's newcomer")
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim, Pairs: []driver.Release{{Key: "j", Lease: "h", Limit: 1}}}))
	countIs(t, s, "j", 0, "released")
}

// A silence of its own is honoured however long: the bound of five
// minutes is on graces that follow one another. After a silence of ten
// minutes, the lease that expired in it lasts, and a newcomer is refused.
func TestLongSilenceHonoured(t *testing.T) {
	s, admin := fastStore(t)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("h", "j", 1, false), 10*time.Second).Status)
	setHeard(t, admin, fastFleet, -10*time.Minute)
	setExpires(t, admin, fastFleet, "h", -9*time.Minute)
	assert.Equal(t, driver.StatusFull, admitIn(t, s, onKey("n", "j", 1, false), 10*time.Second).Status,
		"the newcomer after the silence")
	assert.Greater(t, leaseLeft(t, admin, fastFleet, "j", "h"), int64(0), "h's lease lasts")
}

// graced reports whether lease's row on key is marked as a grace moved it.
func graced(t *testing.T, admin *pgxpool.Pool, fleet, key, lease string) bool {
	t.Helper()
	var g bool
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT graced FROM inflight_lease WHERE fleet = $1 AND key = $2 AND lease = $3",
		fleet, key, lease).Scan(&g))
	return g
}

// A holder whose lease a grace moved, and which extended it since (a
// renewal, its admission made again, a waiter's claim of its grant: the
// mark cleared), is held by the next silence even past the bound on
// graces in a row. The reviewer's case, set by SQL: heard 70 s ago (a
// hang past TTL/2), inside a grace (grace_until 50 s after heard) whose
// chain began 6 min ago, the holder's lease expired 10 s ago. A newcomer
// on its key, capped at 1, is refused, and the holder's renewal finds its
// lease. Before, a silence past the bound moved nothing: the newcomer was
// admitted over the holder, whose renewal found its lease gone.
func TestRenewedHeldPastGraceBound(t *testing.T) {
	ctx := context.Background()
	for _, extend := range []string{"renewal", "admission", "claim"} {
		t.Run(extend, func(t *testing.T) {
			s, admin := fastStore(t)
			key, lease := "j", "h"
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("h", "j", 1, false), 10*time.Second).Status)
			w := kcall("w", 1, true)
			if extend == "claim" { // w granted o's room, on "k"
				key, lease = "k", "w"
				require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("o", 1, false), 10*time.Second).Status)
				rw := admitIn(t, s, w, 10*time.Second)
				require.Equal(t, driver.StatusQueued, rw.Status)
				w.Epoch = rw.Epoch
				require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "o", Limit: 1}}}))
			}
			// A grace moves the lease, and marks it.
			setHeard(t, admin, fastFleet, -40*time.Second)
			setExpires(t, admin, fastFleet, lease, -5*time.Second)
			_, err := s.Renew(ctx, &driver.RenewCall{TTL: fastTTL, Pause: fastTTL})
			require.NoError(t, err)
			require.Greater(t, leaseLeft(t, admin, fastFleet, key, lease), int64(0), "the grace moves the lease")
			require.True(t, graced(t, admin, fastFleet, key, lease), "the grace marks the lease")

			switch extend {
			case "renewal":
				res, err := s.Renew(ctx, renewal("h", "j", 1, driver.ModeReport))
				require.NoError(t, err)
				require.Equal(t, []driver.Fate{driver.FateRenewed}, res.Leases)
			case "admission":
				require.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("h", "j", 1, false), 10*time.Second).Status)
			case "claim":
				require.Equal(t, driver.StatusAdmitted, admitIn(t, s, w, 10*time.Second).Status, "w claims its grant")
			}
			assert.False(t, graced(t, admin, fastFleet, key, lease), "the holder's %s clears the mark", extend)

			// The holder renewed during the grace; then the store hung 70 s.
			_, err = admin.Exec(ctx, `UPDATE inflight_fleet SET heard = inflight_now_us() / 1000 - 70000,
				grace_from = inflight_now_us() / 1000 - 360000, grace_until = inflight_now_us() / 1000 - 20000 WHERE fleet = $1`, fastFleet)
			require.NoError(t, err)
			setExpires(t, admin, fastFleet, lease, -10*time.Second)

			r := admitIn(t, s, onKey("n", key, 1, false), 10*time.Second)
			assert.Equal(t, driver.StatusFull, r.Status, "the newcomer after the silence")
			assert.Greater(t, leaseLeft(t, admin, fastFleet, key, lease), (fastTTL - 10*time.Second).Milliseconds(),
				"the holder's lease lasts a TTL from the end of the silence")
			assert.True(t, graced(t, admin, fastFleet, key, lease), "and is marked again")
			res, err := s.Renew(ctx, renewal(lease, key, 1, driver.ModeReport))
			require.NoError(t, err)
			assert.Equal(t, []driver.Fate{driver.FateRenewed}, res.Leases, "the holder renews its lease")
		})
	}
}
