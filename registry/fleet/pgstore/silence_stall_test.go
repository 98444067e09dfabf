package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Schema revision 12, continued: a call that read its clock before a
// silence was found keeps the grace (no call shortens a live lease), and
// a claim of a lease the grace kept is no newcomer.

// stallTTL is the TTL of the stalled call in TestStalledCallKeepsTheGrace,
// and the one the sleep put into its function waits for.
const stallTTL = time.Second

// stallAfterClock replaces the function fn (a regprocedure's text) with
// one that sleeps d right after it reads its clock, in a call with a TTL
// of stallTTL only: as a server process descheduled there, or a hang,
// would.
func stallAfterClock(t *testing.T, admin *pgxpool.Pool, fn string, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	var def string
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_get_functiondef($1::regprocedure)", fn).Scan(&def))
	const clock = "now := now_us / 1000;\n"
	require.Equal(t, 1, strings.Count(def, clock), "%s reads its clock once", fn)
	slow := strings.Replace(def, clock, fmt.Sprintf("%s\tIF ttl = %d THEN PERFORM pg_sleep(%g); END IF;\n", clock, stallTTL.Milliseconds(), d.Seconds()), 1)
	_, err := admin.Exec(ctx, slow)
	require.NoError(t, err)
}

// sleeping reports whether a call is in pg_sleep.
func sleeping(t *testing.T, admin *pgxpool.Pool) bool {
	t.Helper()
	var n int
	require.NoError(t, admin.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'").Scan(&n))
	return n > 0
}

// A call on h's key ("j", capped at 1) reads its clock under the key's
// lock and stalls 1.5 s there (a sleep put into its function): a renewal
// of h's lease, or h's admission made again (its lease held). h's lease
// had 800 ms left, which the call, with a TTL of 1 s, would extend. While
// it stalls, a call on another key (o's renewal on "k") finds a silence
// (heard set 40 s back) and makes h's lease last a TTL (a minute). The
// stalled call then commits its extension from its old clock, already
// past: it keeps the later expiry, so a newcomer on "j" is refused, and
// h's next renewal finds its lease. Before, it wrote its expiry over the
// grace's, and the newcomer deleted h's lease as expired and was admitted.
func TestStalledCallKeepsTheGrace(t *testing.T) {
	ctx := context.Background()
	calls := map[string]struct {
		fn   string
		call func(s driver.Store) error
	}{
		"renewal": {"inflight_renew(text, bigint, bigint, bigint, bigint, bool, text[], int[], bigint[], int[], text[], bigint[], int[])",
			func(s driver.Store) error {
				c := renewal("h", "j", 1, driver.ModeReport)
				c.TTL = stallTTL
				res, err := s.Renew(ctx, c)
				if err == nil && (len(res.Leases) != 1 || res.Leases[0] != driver.FateRenewed) {
					err = fmt.Errorf("the stalled renewal: %v", res.Leases)
				}
				return err
			}},
		"admission of the holder": {"inflight_admit(text, text, text[], bigint[], bigint, bigint, bigint, bigint, bool, bool, bigint, " +
			"smallint, text, int, text, int, int, bigint, bool, text[], text[], int, int[])",
			func(s driver.Store) error {
				c := onKey("h", "j", 1, false)
				c.TTL = stallTTL
				res, err := s.AdmitOne(ctx, c)
				if err == nil && res.Status != driver.StatusAdmitted {
					err = fmt.Errorf("the stalled admission: status %d", res.Status)
				}
				return err
			}},
	}
	for name, c := range calls {
		t.Run(name, func(t *testing.T) {
			s, admin := fastStore(t) // a server of its own: a function is replaced
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, onKey("h", "j", 1, false), 10*time.Second).Status)
			require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("o", 1, false), 10*time.Second).Status)
			stallAfterClock(t, admin, c.fn, 1500*time.Millisecond)
			setHeard(t, admin, fastFleet, 0)
			setExpires(t, admin, fastFleet, "h", 800*time.Millisecond)

			done := make(chan error, 1)
			go func() { done <- c.call(s) }()
			require.Eventually(t, func() bool { return sleeping(t, admin) }, 10*time.Second, 5*time.Millisecond,
				"the call stalls after reading its clock")
			setHeard(t, admin, fastFleet, -40*time.Second)
			res, err := s.Renew(ctx, renewal("o", "k", 1, driver.ModeReport))
			require.NoError(t, err)
			require.Equal(t, []driver.Fate{driver.FateRenewed}, res.Leases)
			require.Greater(t, leaseLeft(t, admin, fastFleet, "j", "h"), (fastTTL - 10*time.Second).Milliseconds(),
				"o's renewal found the silence and made h's lease last")
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("the stalled call did not return")
			}

			assert.Greater(t, leaseLeft(t, admin, fastFleet, "j", "h"), (fastTTL - 10*time.Second).Milliseconds(),
				"the stalled call kept the grace's expiry")
			assert.Equal(t, driver.StatusFull, admitIn(t, s, onKey("n", "j", 1, false), 10*time.Second).Status,
				"a newcomer on h's key, after the stalled call")
			res, err = s.Renew(ctx, renewal("h", "j", 1, driver.ModeReport))
			require.NoError(t, err)
			assert.Equal(t, []driver.Fate{driver.FateRenewed}, res.Leases, "h renews its lease")
		})
	}
}

// A waiter's call made again after a silence (inflight_admit_passing,
// behind a heavy waiter) whose lease expired in the silence claims the
// lease the grace keeps: it is no newcomer, and is not counted against
// the heavy waiter. As in TestExpiredLeaseDecidedAtTheAdmissionsClock:
// behind "heavy" (5 units) on a key with 4 free, "late" passes it (1 unit
// counted); then nothing is heard for 40 s (TTL/2 is 30 s), late's lease
// expiring 5 s ago, and late's call made again is admitted with 1 unit
// counted still (before: 2, its expiry read before the silence was
// applied).
func TestClaimAfterSilenceIsNoNewcomer(t *testing.T) {
	ctx := context.Background()
	const fleet = "expiry"
	srv := pgtest.Start(t)
	s := store(t, srv, fleet)
	admin := pool(t, srv, 2)
	admit := func(lease string, units int, epoch int64) driver.AdmitResult {
		t.Helper()
		res, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{10}, Units: units, TTL: time.Minute,
			Wait: true, Claim: time.Second, Live: time.Minute, Weight: 1, Proc: "p-" + lease, MaxQueue: -1, MaxFlowQueue: -1,
			Epoch: epoch})
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

	setHeard(t, admin, fleet, -40*time.Second)
	setExpires(t, admin, fleet, "late", -5*time.Second)
	// Epoch 0 makes inflight_claim, the waiter's shortcut, step aside.
	require.Equal(t, driver.StatusAdmitted, admit("late", 1, 0).Status)
	assert.Equal(t, 1, passed(), "a claim of the lease the grace kept: not counted")
	assert.Greater(t, leaseLeft(t, admin, fleet, "k", "late"), (50 * time.Second).Milliseconds(), "late's lease lasts")
}
