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
)

// A database at revision 24 is brought to 25 (servereads.sql): the
// functions it replaces (inflight_serve, inflight_room) keep their
// signatures and stay PL/pgSQL, a connection that ran revision 24's
// before runs 25's after, and a release serves past heavy waiters as
// before (below).
func TestMigrate24To25KeepsTheFunctions(t *testing.T) {
	s := migratedStore(t, 24, `SELECT inflight_serve('f', 'k', 1, 0, 0, 0), inflight_room('f', 'k', 1, NULL, NULL, 0, 0)`)
	call := keysCaller(t, s)
	require.Equal(t, driver.StatusAdmitted, call("H8", []string{"k"}, 8, []int{10}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("H1", []string{"k"}, 1, []int{10}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("H", []string{"k"}, 1, []int{10}, false).Status)
	for i := range 3 {
		require.Equal(t, driver.StatusQueued, call(fmt.Sprint("W", i), []string{"k"}, 3, []int{10}, true).Status)
	}
	require.Equal(t, driver.StatusQueued, call("L", []string{"k"}, 1, []int{10}, true).Status)
	require.NoError(t, s.Release(context.Background(), &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "k", Lease: "H1", Limit: 10}}}))
	countIs(t, s, "k", 10, "L granted past the heavy waiters")
}

// A release's serving passes over the waiters whose units its key's room
// does not fit (heavy, of one key, under their bound) up to its look
// bound, and grants the light waiter behind them only within it; a dead
// waiter's ticket among them is dropped, not passed over (nor counted
// towards the bound). Revision 25
// passes such waiters in the read that finds the next one to serve
// (servereads.sql): the test holds at revision 24 as at 25.
func TestServingPassesHeavyWaitersUpToItsLookBound(t *testing.T) {
	for _, heavy := range []int{driver.PassScan - 1, driver.PassScan} {
		t.Run(fmt.Sprint(heavy, "-heavy"), func(t *testing.T) {
			s, admin := fastStore(t)
			ctx := context.Background()
			call := func(id, proc string, units int, wait bool) driver.AdmitResult {
				c := kcall(id, 10, wait)
				c.Units, c.Proc = units, proc
				return admitIn(t, s, c, 10*time.Second)
			}
			require.Equal(t, driver.StatusAdmitted, call("H8", "p", 8, false).Status)
			require.Equal(t, driver.StatusAdmitted, call("H1", "p", 1, false).Status)
			require.Equal(t, driver.StatusAdmitted, call("H", "p", 1, false).Status) // full
			for i := range heavy + 1 {
				proc := "p"
				if i == heavy/2 {
					proc = "gone" // its process is found dead at the release: no pass
				}
				require.Equal(t, driver.StatusQueued, call(fmt.Sprint("W", i), proc, 3, true).Status)
			}
			require.Equal(t, driver.StatusQueued, call("L", "p", 1, true).Status)
			_, err := admin.Exec(ctx, "UPDATE inflight_proc SET alive_until = 0 WHERE fleet = $1 AND proc = 'gone'", fastFleet)
			require.NoError(t, err)
			require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
				Pairs: []driver.Release{{Key: "k", Lease: "H1", Limit: 10}}}))
			var queued int
			require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = $2",
				fastFleet, pgstore.StoredKey("k")).Scan(&queued))
			if heavy < driver.PassScan {
				countIs(t, s, "k", 10, "L granted, within the look bound")
				assert.Equal(t, heavy, queued, "the heavy waiters but the dead one's")
			} else {
				countIs(t, s, "k", 9, "L past the look bound: the room kept")
				assert.Equal(t, heavy+1, queued, "the heavy waiters but the dead one's, and L")
			}
		})
	}
}
