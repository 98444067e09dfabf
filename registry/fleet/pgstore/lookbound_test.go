package pgstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A database at revision 18 is brought to 19 (as revision 19's New did): the
// function revision 19 replaces (inflight_serve) keeps its signature and
// stays PL/pgSQL, a connection that ran revision 18's before runs 19's
// after, and a release of two pairs on a key, whose serving goes on past
// its look bound, stops where a waiter of several keys before the bound
// is heavy (fleettest's SeveralKeysWaiterBeforeTheLookBound: at revision
// 18 it granted a light waiter past it).
func TestMigrate18To19KeepsTheFunctions(t *testing.T) {
	s := migratedStore(t, 18, `SELECT inflight_serve('f', 'k', 1, 0, 0, 0)`)
	ctx := context.Background()
	call := keysCaller(t, s)
	const lim = 10
	require.Equal(t, driver.StatusAdmitted, call("G", []string{"b"}, 1, []int{1}, false).Status)
	for i, u := range []int{7, 2, 1} {
		require.Equal(t, driver.StatusAdmitted, call(fmt.Sprint("H", i), []string{"a"}, u, []int{lim}, false).Status)
	}
	for i := range driver.PassScan {
		require.Equal(t, driver.StatusQueued, call(fmt.Sprint("W", i), []string{"a", "b"}, 3, []int{lim, 1}, true).Status)
	}
	for _, l := range []string{"L1", "L2"} {
		require.Equal(t, driver.StatusQueued, call(l, []string{"a"}, 1, []int{lim}, true).Status)
	}
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "a", Lease: "H1", Limit: lim}, {Key: "a", Lease: "H2", Limit: lim}}}))
	countIs(t, s, "a", 8, "H0 and L1: W0, heavy once L1 was granted, keeps the rest")
}

// A database at revision 20 is brought to 21: the functions revision 21
// replaces (inflight_serve, inflight_can_take) keep their signatures and
// stay PL/pgSQL, it adds inflight_take_stop, inflight_looked,
// inflight_look_to and inflight_heavy_before, a
// connection that ran revision 20's before runs 21's after, and a
// newcomer's look further on a, past a waiter granted through b meanwhile,
// serves the light waiter V that slid before where it goes on
// (fleettest's LightWaiterSlidBeforeTheLookBound: at revision 20 the look
// skipped V, and the newcomer took its room).
func TestMigrate20To21KeepsTheFunctions(t *testing.T) {
	s := migratedStore(t, 20, `SELECT inflight_serve('f', 'k', 1, 0, 0, 0)`,
		"inflight_heavy_before(text,text,bigint,bigint,text[],bigint,bigint) plpgsql",
		"inflight_look_to(text,integer,inflight_ticket,integer) plpgsql", "inflight_looked(text) plpgsql",
		"inflight_take_stop(text,text,text[],bigint[],text,bigint,integer,bigint,bigint,bigint) plpgsql")
	call := keysCaller(t, s)
	slidQueue(t, s, call)
	assert.Equal(t, driver.StatusFull, call("N", []string{"a", "b"}, 1, []int{10, 10}, false).Status,
		"the newcomer took V's room")
	countIs(t, s, "a", 10, "P, X, V and L")
}

// slidQueue makes fleettest's LightWaiterSlidBeforeTheLookBound queue on s
// through call, up to Q's release, which serves a and stops at its look
// bound, at V: a holds P's 7 units of 10; X (a and b) waits behind Hb on
// b, PassScan-1 waiters F (a and c) behind Gc on c, then V and L (a).
func slidQueue(t *testing.T, s driver.Store, call caller) {
	t.Helper()
	const lim = 10
	require.Equal(t, driver.StatusAdmitted, call("Gb", []string{"b"}, 1, []int{lim}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("Gc", []string{"c"}, 1, []int{1}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("P", []string{"a"}, 7, []int{lim}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("Q", []string{"a"}, 3, []int{lim}, false).Status)
	require.Equal(t, driver.StatusQueued, call("Hb", []string{"b", "d"}, 2, []int{2, lim}, true).Status)
	require.Equal(t, driver.StatusQueued, call("X", []string{"a", "b"}, 1, []int{lim, lim}, true).Status)
	for i := range driver.PassScan - 1 {
		require.Equal(t, driver.StatusQueued, call(fmt.Sprint("F", i), []string{"a", "c"}, 1, []int{lim, 1}, true).Status)
	}
	for _, l := range []string{"V", "L"} {
		require.Equal(t, driver.StatusQueued, call(l, []string{"a"}, 1, []int{lim}, true).Status)
	}
	require.NoError(t, s.Release(context.Background(), &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "a", Lease: "Q", Limit: lim}}}))
	countIs(t, s, "a", 7, "P")
}

// The grants of a serving that goes on past its look bound pass the
// waiters of several keys before it (revision 21: they are read again
// from the queue; at 20 grants past W did not count).
func TestUrgentPastTheLookBound(t *testing.T) {
	fleettest.UrgentPastTheLookBound(t, store(t, pgtest.Start(t), "f"))
}
