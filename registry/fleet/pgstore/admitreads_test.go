package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// A database at revision 25 is brought to 26 (admitreads.sql): the
// functions it replaces (inflight_admit, inflight_still_queued) keep
// their signatures and stay PL/pgSQL, a connection that ran revision
// 25's before runs 26's after, and a waiter of two keys is answered as
// before: it names the key without room for it, with that key's count
// and earliest expiry, k on the whole path and on the ask answered
// without the keys' locks, then o once k has room (the whole path: the
// waiter heads k's queue).
func TestMigrate25To26KeepsTheFunctions(t *testing.T) {
	s := migratedStore(t, 25, `SELECT inflight_still_queued('f', 'l', '{k}', '{1}', 1000, 0, 0, 0, 'p', 3000),
		inflight_admit('f', 'l', '{k}', '{1}', 1000, 0, 0, 0, false, false, 1000, 0::smallint, 'fl', 1, 'p', -1, -1, 3000, false, NULL, NULL, 1, NULL)`)
	ctx := context.Background()
	admit := func(id string, keys []string, units int, limits []int, wait bool, known int64) driver.AdmitResult {
		c := kcall(id, 0, wait)
		c.Keys, c.Limits, c.Units, c.Epoch = keys, limits, units, known
		return admitIn(t, s, c, 10*time.Second)
	}
	a := admit("A", []string{"k"}, 2, []int{3}, false, 0)
	require.Equal(t, driver.StatusAdmitted, a.Status)
	b := admit("B", []string{"o"}, 1, []int{1}, false, 0)
	require.Equal(t, driver.StatusAdmitted, b.Status)
	w := admit("W", []string{"k", "o"}, 2, []int{3, 1}, true, 0)
	require.Equal(t, driver.StatusQueued, w.Status)
	assert.Equal(t, []int64{0, 2, 1}, []int64{int64(w.Key), w.Count, w.Queue}, "k named, A's units")
	require.Positive(t, w.Earliest, "A's expiry")
	for _, known := range []int64{0, w.Epoch} { // the whole path, then the ask without the locks
		r := admit("W", []string{"k", "o"}, 2, []int{3, 1}, true, known)
		require.Equal(t, driver.StatusQueued, r.Status)
		assert.Equal(t, []int64{0, 2, 1}, []int64{int64(r.Key), r.Count, r.Queue}, "known %d", known)
		assert.Equal(t, w.Earliest, r.Earliest, "A's expiry, known %d", known)
	}
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "k", Lease: "A", Limit: 3}}}))
	for _, known := range []int64{0, w.Epoch} {
		r := admit("W", []string{"k", "o"}, 2, []int{3, 1}, true, known)
		require.Equal(t, driver.StatusQueued, r.Status)
		assert.Equal(t, []int64{1, 1, 1}, []int64{int64(r.Key), r.Count, r.Queue}, "o named, B's units, known %d", known)
		assert.Positive(t, r.Earliest, "B's expiry, known %d", known)
		assert.NotEqual(t, w.Earliest, r.Earliest, "not A's, known %d", known)
	}
}
