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

// A release of n pairs on a key whose queue holds n × PassScan waiters of
// several keys, each held up on its other key, serves the key n times,
// each going PassScan waiters further: every waiter is looked at (its room
// checked, inflight_take_stop) about once, not once per serving before it.
// A first version of revision 21, whose servings looked again from the
// head as far as start + PassScan, made n(n+1)/2 × PassScan looks, and an
// OFFSET scan of the queue per step (a release of 32 pairs over 2048 such
// waiters took 25 s on two cores, 1.7 s at revision 20, holding the key's
// lock throughout); the mark of where a look stopped keeps it to one.
func TestBatchReleaseLooksAtEachWaiterAboutOnce(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	call := keysCaller(t, s)
	const n = 8
	keys, leases, limits := heldPairs(t, call, n)
	for i := range n * driver.PassScan {
		require.Equal(t, driver.StatusQueued, call(fmt.Sprint("W", i), []string{"a", "c"}, 1, []int{n, 1}, true).Status)
	}
	// The release as Store.Release makes it, in a transaction of the
	// test's that counts the functions' calls, rolled back.
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SET LOCAL track_functions = 'pl'")
	require.NoError(t, err)
	t0 := time.Now()
	_, err = tx.Exec(ctx, "SELECT inflight_release($1, $2, $3, $4, $5, false, $6)", fastFleet, driver.Millis(fastClaim),
		keys, leases, limits, driver.Millis(fastTTL))
	require.NoError(t, err)
	t.Logf("a release of %d pairs over %d waiters: %v", n, n*driver.PassScan, time.Since(t0).Round(time.Millisecond))
	var serves, looks int
	require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(sum(calls) FILTER (WHERE funcname = 'inflight_serve'), 0),
		coalesce(sum(calls) FILTER (WHERE funcname = 'inflight_take_stop'), 0) FROM pg_stat_xact_user_functions`).Scan(&serves, &looks))
	require.Equal(t, n, serves, "one serving per pair: each stops at its look bound")
	assert.LessOrEqual(t, looks, 2*n*driver.PassScan, "the waiters' rooms checked once per serving before them")
}

// A look further on a key goes on from the waiter the look before it did
// not reach, by that look's mark (inflight_looked) or, with no mark (a
// serving of the key from the head since took it away), by looking again
// from the head as far: either way V, which slid before where the look
// stopped when X (before it, of a and b) was granted through b, is served
// before L behind it. The servings are made one by one, in a transaction
// of the test's, as a newcomer's call on a and b makes them.
func TestLookFurtherFindsTheSlidWaiter(t *testing.T) {
	for _, mark := range []bool{true, false} {
		t.Run(map[bool]string{true: "Mark", false: "FromTheHead"}[mark], func(t *testing.T) {
			s, admin := fastStore(t)
			ctx := context.Background()
			slidQueue(t, s, keysCaller(t, s))
			const lim = 10
			tx, err := admin.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			serve := func(k string, start int) int {
				var r int
				require.NoError(t, tx.QueryRow(ctx, "SELECT inflight_serve($1, $2, $3, inflight_now_us() / 1000, $4, $5)",
					fastFleet, pgstore.StoredKey(k), lim, driver.Millis(fastClaim), start).Scan(&r))
				return r
			}
			_, err = tx.Exec(ctx, "SELECT inflight_lock($1, $2)", fastFleet, []string{pgstore.StoredKey("a"), pgstore.StoredKey("b")})
			require.NoError(t, err)
			stop := serve("a", 0)
			require.Equal(t, driver.PassScan+1, stop, "a's serving stops at its look bound, at V")
			require.Zero(t, serve("b", 0), "b's serving grants X")
			if !mark {
				_, err = tx.Exec(ctx, "SELECT set_config('inflight.looked', '', true)")
				require.NoError(t, err)
			}
			assert.Zero(t, serve("a", stop-1), "the look further fills a")
			var granted []string
			rows, err := tx.Query(ctx, "SELECT lease FROM inflight_lease WHERE fleet = $1 AND key = $2 AND lease <> 'P' ORDER BY lease",
				fastFleet, pgstore.StoredKey("a"))
			require.NoError(t, err)
			for rows.Next() {
				var l string
				require.NoError(t, rows.Scan(&l))
				granted = append(granted, l)
			}
			require.NoError(t, rows.Err())
			assert.Equal(t, []string{"L", "V", "X"}, granted)
		})
	}
}

// A release of n pairs on a key whose queue holds, before each of n light
// waiters of the key, PassScan waiters of several keys held up on their
// other key: each look further grants one and goes PassScan waiters on.
// Each waiter looked at has its room checked on the key
// (inflight_room_of), which looks for the key's oldest urgent ticket:
// without an index of the urgent tickets that read the key's whole queue,
// at each look (a release of 64 pairs over 4160 such waiters took 6 s on
// two cores, 5 s of it in inflight_room_of, 35 million rows read). The
// table's rows read (by index or not) stay within a bound per waiter.
func TestBatchReleaseFindsTheOldestUrgentTicketByItsIndex(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	call := keysCaller(t, s)
	const n = 16
	keys, leases, limits := heldPairs(t, call, n)
	for j := range n {
		for i := range driver.PassScan {
			require.Equal(t, driver.StatusQueued, call(fmt.Sprint("W", j, "-", i), []string{"a", "c"}, 1, []int{n, 1}, true).Status)
		}
		require.Equal(t, driver.StatusQueued, call(fmt.Sprint("L", j), []string{"a"}, 1, []int{n}, true).Status)
	}
	waiters := n * (driver.PassScan + 1)
	_, err := admin.Exec(ctx, "ANALYZE inflight_ticket") // plans as on a server whose statistics are current
	require.NoError(t, err)
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	t0 := time.Now()
	_, err = tx.Exec(ctx, "SELECT inflight_release($1, $2, $3, $4, $5, false, $6)", fastFleet, driver.Millis(fastClaim),
		keys, leases, limits, driver.Millis(fastTTL))
	require.NoError(t, err)
	t.Logf("a release of %d pairs over %d waiters: %v", n, waiters, time.Since(t0).Round(time.Millisecond))
	var read int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
		WHERE relname = 'inflight_ticket'`).Scan(&read))
	var granted int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM inflight_lease WHERE fleet = $1 AND key = $2 AND lease LIKE 'L%'",
		fastFleet, pgstore.StoredKey("a")).Scan(&granted))
	require.Equal(t, n-1, granted, "each look further grants a light waiter")
	assert.LessOrEqual(t, read, int64(200*waiters), "the queue's rows read per waiter looked at")
}

// heldPairs fills c (Gc, its limit 1) and a with n leases of 1 unit under
// a limit of n, and returns them as a release's arguments.
func heldPairs(t *testing.T, call caller, n int) (keys, leases []string, limits []int64) {
	t.Helper()
	require.Equal(t, driver.StatusAdmitted, call("Gc", []string{"c"}, 1, []int{1}, false).Status)
	for i := range n {
		id := fmt.Sprint("H", i)
		require.Equal(t, driver.StatusAdmitted, call(id, []string{"a"}, 1, []int{n}, false).Status)
		keys, leases, limits = append(keys, pgstore.StoredKey("a")), append(leases, id), append(limits, int64(n))
	}
	return keys, leases, limits
}
