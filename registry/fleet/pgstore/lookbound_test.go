package pgstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
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
