package pgstore_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// A database at revision 17 is brought to 18 (as revision 18's New did): the
// functions revision 18 replaces (inflight_admit, inflight_still_queued)
// keep their signatures (no overload is added) and stay PL/pgSQL, a
// connection that ran revision 17's before runs 18's after, and a queued
// waiter of two keys that asks again names the key it waits on
// (fleettest's QueuedNamesTheKeyItWaitsOn: at revision 17 it named the
// key with room, a heavy waiter behind it).
func TestMigrate17To18KeepsTheFunctions(t *testing.T) {
	s := migratedStore(t, 17, `SELECT inflight_admit('f', 'x', '{k}', '{1}', 1000, 0, 0, 0, false, false, 1000, 0::smallint, '', 1, 'p', -1, -1,
		3000, false, '{}', '{}', 1, '{}')`)
	call := keysCaller(t, s)
	require.Equal(t, driver.StatusAdmitted, call("H", []string{"a"}, 2, []int{3}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("G", []string{"b"}, 1, []int{1}, false).Status)
	require.Equal(t, driver.StatusQueued, call("W", []string{"a", "b"}, 1, []int{3, 1}, true).Status)
	require.Equal(t, driver.StatusQueued, call("Y", []string{"a"}, 2, []int{3}, true).Status)
	res := call("W", []string{"a", "b"}, 1, []int{3, 1}, true)
	require.Equal(t, driver.StatusQueued, res.Status)
	assert.Equal(t, 1, res.Key, "W waits on b: %+v", res)
}
