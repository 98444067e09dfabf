package pgstore_test

import (
	"context"
	"fmt"
	"testing"

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
