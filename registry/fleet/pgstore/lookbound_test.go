package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A database at revision 18 is brought to 19 by this release's New: the
// function revision 19 replaces (inflight_serve) keeps its signature and
// stays PL/pgSQL, a connection that ran revision 18's before runs 19's
// after, and a release of two pairs on a key, whose serving goes on past
// its look bound, stops where a waiter of several keys before the bound
// is heavy (fleettest's SeveralKeysWaiterBeforeTheLookBound: at revision
// 18 it granted a light waiter past it).
func TestMigrate18To19KeepsTheFunctions(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, p, 18))
	before := inflightFunctions(t, p)
	// Revision 18's inflight_serve runs on this connection (its plans kept).
	_, err := p.Exec(ctx, `SELECT inflight_serve('f', 'k', 1, 0, 0, 0)`)
	require.NoError(t, err)
	s, err := pgstore.New(ctx, p, fastFleet)
	require.NoError(t, err)
	assert.Equal(t, before, inflightFunctions(t, p), "revision 19 replaces functions under their signatures, in their languages")
	var r int
	require.NoError(t, p.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&r))
	assert.Equal(t, 19, r)
	call := func(id string, keys []string, units int, limits []int, wait bool) driver.AdmitResult {
		c := kcall(id, 0, wait)
		c.Keys, c.Limits, c.Units = keys, limits, units
		return admitIn(t, s, c, 10*time.Second)
	}
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
