package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// A release of many leases on one key, whose serving stops at its bound
// on the waiters it looks at (dead processes' tickets dropped at the
// head, then grants), goes on from there (schema revision 7): every unit
// it freed goes to a live waiter, as when each lease was released alone.
func TestBatchReleaseGoesOnPastServingsBound(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	const n = 150 // 150 dropped and 150 granted: past 4 × PassScan looks
	var pairs []driver.Release
	for i := range n {
		id := fmt.Sprint("h", i)
		require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall(id, n, false), fastTTL).Status)
		pairs = append(pairs, driver.Release{Key: "k", Lease: id, Limit: n})
	}
	for i := range 2 * n {
		c := kcall(fmt.Sprint("w", i), n, true)
		if i < n {
			c.Proc = "q" // dead below
		}
		require.Equal(t, driver.StatusQueued, admitIn(t, s, c, fastTTL).Status)
	}
	_, err := admin.Exec(ctx, "UPDATE inflight_proc SET alive_until = 0 WHERE fleet = $1 AND proc = 'q'", fastFleet)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: pairs}))
	countIs(t, s, "k", n, "every unit freed granted")
}

// Serving stops once a grant fills the key (it adds each grant's units to
// the key's count): a dead process's ticket behind the waiter granted is
// not reached (nor dropped) by that serving.
func TestServingStopsWhenAGrantFillsTheKey(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("h", 1, false), fastTTL).Status)
	require.Equal(t, driver.StatusQueued, admitIn(t, s, kcall("w", 1, true), fastTTL).Status)
	d := kcall("d", 1, true)
	d.Proc = "q"
	require.Equal(t, driver.StatusQueued, admitIn(t, s, d, fastTTL).Status)
	_, err := admin.Exec(ctx, "UPDATE inflight_proc SET alive_until = 0 WHERE fleet = $1 AND proc = 'q'", fastFleet)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "h", Limit: 1}}}))
	countIs(t, s, "k", 1, "w granted")
	var queued []string
	require.NoError(t, admin.QueryRow(ctx, "SELECT coalesce(array_agg(ticket), '{}') FROM inflight_ticket WHERE fleet = $1 AND key = 'k'",
		fastFleet).Scan(&queued))
	require.Equal(t, []string{"d"}, queued, "serving stopped at the full key, before d")
}

// A grant to a ticket that holds a lease on the key already (put back
// while it waited: the lease counts) adds nothing to the key's count, and
// serving goes on to the next waiter.
func TestServingGrantsPastALeaseHeldAlready(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("h", 2, false), fastTTL).Status)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("o", 2, false), fastTTL).Status)
	require.Equal(t, driver.StatusQueued, admitIn(t, s, kcall("w", 2, true), fastTTL).Status)
	require.Equal(t, driver.StatusQueued, admitIn(t, s, kcall("x", 2, true), fastTTL).Status)
	// w's lease put back while it waits (as a renewal after a loss does),
	// in o's place: the key stays full.
	_, err := admin.Exec(ctx, `UPDATE inflight_lease SET lease = 'w' WHERE fleet = $1 AND key = 'k' AND lease = 'o'`, fastFleet)
	require.NoError(t, err)
	countIs(t, s, "k", 2, "h and w's lease")
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "h", Limit: 2}}}))
	var leases []string
	require.NoError(t, admin.QueryRow(ctx, "SELECT array_agg(lease ORDER BY lease) FROM inflight_lease WHERE fleet = $1 AND key = 'k'",
		fastFleet).Scan(&leases))
	assert.Equal(t, []string{"w", "x"}, leases, "w's grant kept its lease, and x took h's place")
	countIs(t, s, "k", 2, "w and x")
}

// A grant under a claim window of 0 to a waiter whose liveness is 1 ms
// (the fleet's client sends at least 10 ms and 3 claim windows; a store's
// own caller may not) is made for a millisecond, and the waiter lives 3
// (driver.Millis, AdmitCall.LiveMillis), as on Redis: the grant outlives
// the serving that made it, and the waiter is not taken for dead there.
// The database's clock is stopped, so that "after now" is seen at once.
func TestAGrantUnderAClaimOfNoTimeCounts(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	var now int64
	require.NoError(t, admin.QueryRow(ctx, "SELECT inflight_now_us()").Scan(&now))
	_, err := admin.Exec(ctx, fmt.Sprintf("CREATE OR REPLACE FUNCTION inflight_now_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$ SELECT %d::bigint $$", now))
	require.NoError(t, err)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("h", 1, false), fastTTL).Status)
	for _, id := range []string{"w", "x", "y"} {
		c := kcall(id, 1, true)
		c.Claim, c.Live = 0, time.Millisecond
		require.Equal(t, driver.StatusQueued, admitIn(t, s, c, fastTTL).Status)
	}
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: 0, Pairs: []driver.Release{{Key: "k", Lease: "h", Limit: 1}}}))
	var leases []string
	require.NoError(t, admin.QueryRow(ctx, "SELECT coalesce(array_agg(lease ORDER BY lease), '{}') FROM inflight_lease WHERE fleet = $1 AND key = 'k'",
		fastFleet).Scan(&leases))
	assert.Equal(t, []string{"w"}, leases, "one grant, to the head")
	countIs(t, s, "k", 1, "w's grant, not expired at the serving's now")
}

// Within one serving under a claim window of 0, a grant made on two keys
// is not taken for expired by the next waiter's room check on the other
// key (which drops that key's expired leases): a waits on k and j, b
// behind it; both of k's holders go; a is granted on both keys, and b,
// with no room left on j, stays queued. (A review's case: without the
// millisecond, b was granted on both keys past a, whose grant on j was
// dropped.)
func TestServingUnderAClaimOfNoTimeGrantsOnlyTheRoom(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	two := func(id string) *driver.AdmitCall {
		c := kcall(id, 2, true)
		c.Keys, c.Limits = []string{"k", "j"}, []int{2, 1}
		return c
	}
	for _, id := range []string{"h1", "h2"} {
		require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall(id, 2, false), fastTTL).Status)
	}
	for _, id := range []string{"a", "b"} {
		require.Equal(t, driver.StatusQueued, admitIn(t, s, two(id), fastTTL).Status)
	}
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: 0, Pairs: []driver.Release{{Key: "k", Lease: "h1", Limit: 2}, {Key: "k", Lease: "h2", Limit: 2}}}))
	var leases []string
	require.NoError(t, admin.QueryRow(ctx, "SELECT coalesce(array_agg(key || ':' || lease ORDER BY key, lease), '{}') FROM inflight_lease WHERE fleet = $1",
		fastFleet).Scan(&leases))
	assert.Equal(t, []string{"j:a", "k:a"}, leases, "a granted on both keys, b left queued")
}
