package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Schema revision 10: whether a waiting call of one key made again is a
// claim of its lease or a newcomer (counted against the heavy waiter it
// passes) is decided at inflight_admit's clock, which deletes the expired
// leases, not at an earlier look. Behind a heavy waiter of 5 units on a
// key with 4 free, "late" passes it (1 unit counted); its call made again
// while its lease lives is a claim (not counted), and one made again as
// the lease expires between inflight_admit_passing's look and
// inflight_admit's clock (the time between widened by a sleep put into
// inflight_still_queued, which runs between them, as a descheduled
// server process would) is a newcomer (counted).
func TestExpiredLeaseDecidedAtTheAdmissionsClock(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Start(t) // a server of its own: a function is replaced below
	s := store(t, srv, "expiry")
	admin := pool(t, srv, 2)
	call := func(lease string, units int, epoch int64) *driver.AdmitCall {
		return &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{10}, Units: units, TTL: time.Minute,
			Wait: true, Claim: time.Second, Live: time.Minute, Weight: 1, Proc: "p-" + lease, MaxQueue: -1, MaxFlowQueue: -1,
			Epoch: epoch}
	}
	admit := func(lease string, units int, epoch int64) driver.AdmitResult {
		t.Helper()
		res, err := s.AdmitOne(ctx, call(lease, units, epoch))
		require.NoError(t, err)
		return res
	}
	passed := func() int {
		t.Helper()
		var n int
		require.NoError(t, admin.QueryRow(ctx, "SELECT passed_units FROM inflight_ticket WHERE ticket = 'heavy'").Scan(&n))
		return n
	}
	filler := admit("filler", 6, 0)
	require.Equal(t, driver.StatusAdmitted, filler.Status)
	require.Equal(t, driver.StatusQueued, admit("heavy", 5, filler.Epoch).Status, "6 + 5 over 10")
	require.Equal(t, driver.StatusAdmitted, admit("late", 1, filler.Epoch).Status)
	require.Equal(t, 1, passed(), "a newcomer passing the heavy waiter")

	// Epoch 0 makes inflight_claim, the waiter's shortcut, step aside.
	require.Equal(t, driver.StatusAdmitted, admit("late", 1, 0).Status)
	assert.Equal(t, 1, passed(), "a claim of a lease that lives: not counted")

	var def string
	require.NoError(t, admin.QueryRow(ctx, `SELECT pg_get_functiondef('inflight_still_queued(text, text, text[], bigint[],
		bigint, bigint, bigint, bigint, text, bigint)'::regprocedure)`).Scan(&def))
	slow := strings.Replace(def, "BEGIN\n", "BEGIN\n\tPERFORM pg_sleep(0.05);\n", 1)
	require.NotEqual(t, def, slow)
	_, err := admin.Exec(ctx, slow)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "UPDATE inflight_lease SET expires = inflight_now_us() / 1000 + 10 WHERE lease = 'late'")
	require.NoError(t, err)
	res := admit("late", 1, 0)
	require.Equal(t, driver.StatusAdmitted, res.Status)
	assert.Equal(t, 2, passed(), "a lease expired at inflight_admit's clock made no claim: a newcomer, counted")
}
