package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A database at revision 17 is brought to 18 (as revision 18's New did): the
// functions revision 18 replaces (inflight_admit, inflight_still_queued)
// keep their signatures (no overload is added) and stay PL/pgSQL, a
// connection that ran revision 17's before runs 18's after, and a queued
// waiter of two keys that asks again names the key it waits on
// (fleettest's QueuedNamesTheKeyItWaitsOn: at revision 17 it named the
// key with room, a heavy waiter behind it).
func TestMigrate17To18KeepsTheFunctions(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, p, 17))
	before := inflightFunctions(t, p)
	// Revision 17's inflight_admit runs on this connection (its plans kept).
	_, err := p.Exec(ctx, `SELECT inflight_admit('f', 'x', '{k}', '{1}', 1000, 0, 0, 0, false, false, 1000, 0::smallint, '', 1, 'p', -1, -1,
		3000, false, '{}', '{}', 1, '{}')`)
	require.NoError(t, err)
	require.NoError(t, pgstore.MigrateTo(ctx, p, 18))
	assert.Equal(t, before, inflightFunctions(t, p), "revision 18 replaces functions under their signatures, in their languages")
	var r int
	require.NoError(t, p.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&r))
	assert.Equal(t, 18, r)
	s, err := pgstore.New(ctx, p, fastFleet)
	require.NoError(t, err)
	call := func(id string, keys []string, units int, limits []int, wait bool) driver.AdmitResult {
		c := kcall(id, 0, wait)
		c.Keys, c.Limits, c.Units = keys, limits, units
		return admitIn(t, s, c, 10*time.Second)
	}
	require.Equal(t, driver.StatusAdmitted, call("H", []string{"a"}, 2, []int{3}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("G", []string{"b"}, 1, []int{1}, false).Status)
	require.Equal(t, driver.StatusQueued, call("W", []string{"a", "b"}, 1, []int{3, 1}, true).Status)
	require.Equal(t, driver.StatusQueued, call("Y", []string{"a"}, 2, []int{3}, true).Status)
	res := call("W", []string{"a", "b"}, 1, []int{3, 1}, true)
	require.Equal(t, driver.StatusQueued, res.Status)
	assert.Equal(t, 1, res.Key, "W waits on b: %+v", res)
}
