package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Leases that weigh units (schema revision 2), on the store's calls.

// oldRelease makes the calls of the release before the units, as its
// store.go makes them: inflight_admit of 21 arguments and inflight_renew
// of 12, on a pool of one connection (the one that ran the old bodies
// before the migration runs the new ones after it).
type oldRelease struct {
	t     *testing.T
	p     *pgxpool.Pool
	fleet string
}

// admit admits lease on key under limit, or queues it with wait, and
// returns the reply: {status, key, count, earliest, now, epoch, queue}.
func (o oldRelease) admit(lease, key string, limit int64, wait bool) []int64 {
	o.t.Helper()
	var res []int64
	require.NoError(o.t, o.p.QueryRow(context.Background(),
		`SELECT inflight_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`,
		o.fleet, lease, []string{key}, []int64{limit}, int64(60000), int64(0), int64(0), int64(60000), wait, false, int64(20000),
		int16(0), "", 1, "old", -1, -1, int64(120000), true, []string(nil), []string(nil)).Scan(&res), "the old admission of %s", lease)
	require.GreaterOrEqual(o.t, len(res), 7)
	return res
}

// renew renews lease on key, reporting it if missing, and returns its fate.
func (o oldRelease) renew(lease, key string, limit int64) driver.Fate {
	o.t.Helper()
	var res []int64
	require.NoError(o.t, o.p.QueryRow(context.Background(), `SELECT inflight_renew($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		o.fleet, int64(60000), int64(0), int64(0), int64(60000), true, []string{lease}, []int32{int32(driver.ModeReport)},
		[]int64{0}, []int32{1}, []string{key}, []int64{limit}).Scan(&res))
	require.Len(o.t, res, 3)
	return driver.Fate(res[2])
}

// count is the count inflight_count returns.
func (o oldRelease) count(key string) int {
	o.t.Helper()
	var n int
	require.NoError(o.t, o.p.QueryRow(context.Background(), `SELECT inflight_count($1, $2, (inflight_now_us() / 1000))`, o.fleet, key).Scan(&n))
	return n
}

// release releases lease on key (inflight_release kept its signature).
func (o oldRelease) release(lease, key string, limit int64) {
	o.t.Helper()
	_, err := o.p.Exec(context.Background(), `SELECT inflight_release($1, $2, $3, $4, $5, $6)`,
		o.fleet, int64(20000), []string{key}, []string{lease}, []int64{limit}, true)
	require.NoError(o.t, err)
}

// ucall is an admission of id on key "k" weighing units under limit, as
// the fleet client makes it (kcall's, with units).
func ucall(id string, units, limit int, wait bool) *driver.AdmitCall {
	c := kcall(id, limit, wait)
	c.Units = units
	return c
}

// countIs requires key's count, in units, to be n.
func countIs(t *testing.T, s driver.Store, key string, n int, msg string) {
	t.Helper()
	got, err := s.Count(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, n, got, msg)
}

// A database that the release before the units migrated (revision 1),
// with leases and a waiter in it, is brought to revision 2 by this
// release's New. Its rows weigh 1 unit each. The old release's calls,
// on the connection that ran them before, still work and count units: a
// weighted lease of this release fills a key for them, and a heavy
// waiter keeps its room from their newcomers.
func TestMigrateUnitsFromRevision1(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	old := oldRelease{t: t, p: pool(t, srv, 1), fleet: fastFleet}
	require.NoError(t, pgstore.MigrateTo(ctx, old.p, 1))
	var hasUnits bool
	require.NoError(t, old.p.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_name = 'inflight_lease' AND column_name = 'units')`).Scan(&hasUnits))
	require.False(t, hasUnits, "revision 1 has no units")

	for _, id := range []string{"A", "B", "C"} {
		require.Equal(t, int64(driver.StatusAdmitted), old.admit(id, "k", 3, false)[0], id)
	}
	rw := old.admit("W", "k", 3, true)
	require.Equal(t, int64(driver.StatusQueued), rw[0], "W waits behind A, B and C")

	s := store(t, srv, fastFleet) // this release: New migrates
	var revision int
	require.NoError(t, old.p.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&revision))
	assert.Equal(t, pgstore.SchemaRevision, revision)
	var leases, leaseUnits, tickets, ticketUnits int
	require.NoError(t, old.p.QueryRow(ctx, `SELECT (SELECT count(*) FROM inflight_lease), (SELECT sum(units) FROM inflight_lease),
		(SELECT count(*) FROM inflight_ticket), (SELECT sum(units) FROM inflight_ticket)`).Scan(&leases, &leaseUnits, &tickets, &ticketUnits))
	assert.Equal(t, []int{3, 3, 1, 1}, []int{leases, leaseUnits, tickets, ticketUnits}, "the rows there weigh 1 unit each")
	countIs(t, s, "k", 3, "A, B and C")
	assert.Equal(t, 3, old.count("k"))

	// The old release's calls, on its connection.
	assert.Equal(t, driver.FateRenewed, old.renew("A", "k", 3))
	old.release("C", "k", 3) // serves W: a grant of 1 unit
	countIs(t, s, "k", 3, "A, B and W's grant")
	assert.Equal(t, int64(driver.StatusAdmitted), old.admit("W", "k", 3, true)[0], "W claims its grant")
	old.release("B", "k", 3)
	old.release("W", "k", 3)
	countIs(t, s, "k", 1, "A")

	// A lease of 2 units of this release fills the key for the old
	// release's admissions under a limit of 3, not under 4.
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("X", 2, 3, false), 10*time.Second).Status)
	full := old.admit("D", "k", 3, false)
	assert.Equal(t, int64(driver.StatusFull), full[0], "1 + 2 units: full for 1 more under 3")
	assert.Equal(t, int64(3), full[2], "the refusal's count is in units")
	assert.Equal(t, int64(driver.StatusAdmitted), old.admit("E", "k", 4, false)[0], "1 + 2 + 1 under 4")
	assert.Equal(t, 4, old.count("k"))

	// A heavy waiter of this release (3 units under 6, with 4 held) keeps
	// the 2 units free from the old release's newcomers.
	rh := admitIn(t, s, ucall("H", 3, 6, true), 10*time.Second)
	require.Equal(t, driver.StatusQueued, rh.Status)
	assert.Equal(t, int64(driver.StatusFull), old.admit("F", "k", 6, false)[0], "kept for the heavy waiter")
	old.release("E", "k", 6) // 3 held: H is granted its 3 units
	countIs(t, s, "k", 6, "A, X and H's grant")
	h := ucall("H", 3, 6, true)
	h.Epoch = rh.Epoch
	assert.Equal(t, driver.StatusAdmitted, admitIn(t, s, h, 10*time.Second).Status, "H claims its grant")
	assert.Equal(t, driver.FateRenewed, old.renew("H", "k", 6), "the old renewal extends a weighted lease")
	for _, id := range []string{"A", "X", "H"} {
		old.release(id, "k", 6)
	}
	countIs(t, s, "k", 0, "all released")
	assert.Equal(t, 0, old.count("k"))
}

// An admission of the old release under way while the revision commits
// (it waits for its key's row meanwhile) goes on in the bodies it started
// with, which call the helpers by their old signatures: it queues a ticket
// of 1 unit, which a release of this release then grants.
func TestOldCallAcrossTheMigration(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	old := oldRelease{t: t, p: pool(t, srv, 2), fleet: fastFleet}
	require.NoError(t, pgstore.MigrateTo(ctx, old.p, 1))
	require.Equal(t, int64(driver.StatusAdmitted), old.admit("A", "k", 1, false)[0])

	admin := pool(t, srv, 2)
	unlock := holdKey(t, admin)
	got := make(chan []int64, 1)
	go func() {
		var res []int64
		err := old.p.QueryRow(ctx, `SELECT inflight_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`,
			fastFleet, "B", []string{"k"}, []int64{1}, int64(60000), int64(0), int64(0), int64(60000), true, false, int64(20000),
			int16(0), "", 1, "old", -1, -1, int64(120000), true, []string(nil), []string(nil)).Scan(&res)
		if err != nil {
			res = []int64{-100}
			t.Errorf("B's admission: %v", err)
		}
		got <- res
	}()
	require.Eventually(t, func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%inflight_admit%'`).Scan(&n)
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "B's call waits for the key's row")
	s := store(t, srv, fastFleet) // migrates meanwhile
	unlock()
	res := <-got
	require.Equal(t, int64(driver.StatusQueued), res[0], "B queued: %v", res)
	var units int
	require.NoError(t, admin.QueryRow(ctx, "SELECT units FROM inflight_ticket WHERE fleet = $1 AND ticket = 'B'", fastFleet).Scan(&units))
	assert.Equal(t, 1, units)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "A", Limit: 1}}}))
	countIs(t, s, "k", 1, "B's grant")
}

// Weighted and unweighted leases, on keys alone and together, end at a
// count of 0 whichever way they leave: a release, an expiry, an abandon,
// a grant given back (a limit lowered under it), and leases put back by
// an admission's carried pairs and by a renewal.
func TestUnitsLeaveNothing(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	admitted := func(c *driver.AdmitCall) driver.AdmitResult {
		t.Helper()
		r := admitIn(t, s, c, 10*time.Second)
		require.Equal(t, driver.StatusAdmitted, r.Status, "%s admitted", c.Lease)
		return r
	}
	release := func(lease string, keys ...string) {
		t.Helper()
		var pairs []driver.Release
		for _, k := range keys {
			pairs = append(pairs, driver.Release{Key: k, Lease: lease, Limit: 10})
		}
		require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: pairs}))
	}
	abandon := func(lease string, limit int) {
		t.Helper()
		errs, err := s.Abandon(ctx, []*driver.AbandonCall{{Lease: lease, Keys: []string{"k"}, Limits: []int{limit}, TTL: fastTTL, Claim: fastClaim}})
		require.NoError(t, err)
		require.NoError(t, errs[0])
	}

	both := ucall("A", 3, 10, false) // 3 units on "k" and "x"
	both.Keys, both.Limits = []string{"k", "x"}, []int{10, 10}
	epoch := admitted(both).Epoch
	admitted(ucall("B", 1, 10, false))
	short := ucall("C", 4, 10, false)
	short.TTL = time.Second
	admitted(short)
	countIs(t, s, "k", 8, "3 + 1 + 4")
	countIs(t, s, "x", 3, "A")

	d := ucall("D", 3, 10, true)
	d.Epoch = epoch
	require.Equal(t, driver.StatusQueued, admitIn(t, s, d, 10*time.Second).Status, "8 + 3 over 10")
	e := admitIn(t, s, ucall("E", 1, 10, false), 10*time.Second)
	assert.Equal(t, driver.StatusFull, e.Status, "8 + 1 fits, but D waits for its 3 units first")
	assert.Equal(t, int64(8), e.Count)

	require.Eventually(t, func() bool { // C's lease of a second expires on the server's clock
		n, err := s.Count(context.Background(), "k")
		return err == nil && n == 4
	}, 10*time.Second, 10*time.Millisecond, "C's 4 units expired")
	release("B", "k") // serves D: a grant of 3 units
	countIs(t, s, "k", 6, "A and D's grant")
	var granted bool
	var units int
	require.NoError(t, admin.QueryRow(ctx, "SELECT granted, units FROM inflight_lease WHERE fleet = $1 AND key = 'k' AND lease = 'D'",
		fastFleet).Scan(&granted, &units))
	assert.True(t, granted)
	assert.Equal(t, 3, units, "the grant weighs the ticket's units")

	// D claims under a limit lowered to 5: 6 units held, so its grant is
	// given back and it waits again; then its caller abandons it.
	lowered := ucall("D", 3, 5, true)
	lowered.Epoch = epoch
	assert.Equal(t, driver.StatusQueued, admitIn(t, s, lowered, 10*time.Second).Status, "given back: 3 + 3 over 5")
	countIs(t, s, "k", 3, "D's grant given back")
	abandon("D", 5)
	countIs(t, s, "k", 3, "A")

	// G carries F (2 units, admitted while the store was out of reach);
	// a renewal puts P (2 units) back.
	g := ucall("G", 1, 10, false)
	g.Carried = []driver.Pair{{Key: "k", Lease: "F", Units: 2}}
	admitted(g)
	countIs(t, s, "k", 6, "A, F and G")
	rr, err := s.Renew(ctx, &driver.RenewCall{TTL: fastTTL, Epoch: epoch, Leases: []driver.Renewal{
		{Lease: "P", Units: 2, Mode: driver.ModePutBack, Epoch: epoch, Keys: []string{"k"}, Limits: []int{10}}}})
	require.NoError(t, err)
	assert.Equal(t, []driver.Fate{driver.FatePutBack}, rr.Leases)
	countIs(t, s, "k", 8, "A, F, G and P")
	abandon("F", 10)
	countIs(t, s, "k", 6, "F's 2 units abandoned")

	release("A", "k", "x")
	release("G", "k")
	release("P", "k")
	countIs(t, s, "k", 0, "all gone")
	countIs(t, s, "x", 0, "all gone")
	var rows, queued int
	require.NoError(t, admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM inflight_lease WHERE fleet = $1 AND expires > inflight_now_us() / 1000),
		(SELECT count(*) FROM inflight_ticket WHERE fleet = $1)`, fastFleet).Scan(&rows, &queued))
	assert.Zero(t, rows, "no lease left")
	assert.Zero(t, queued, "no ticket left")
}

// The place a key keeps for its oldest urgent ticket (one of several keys
// passed over many times) is that ticket's units: U, of 3 units, waits
// for "x"; on "k" (10), a newcomer of 1 unit fits beside 6 units held,
// not beside 7.
func TestUrgentKeepsItsUnits(t *testing.T) {
	s, admin := fastStore(t)
	ctx := context.Background()
	urgentOnX(t, s, admin, 1)

	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("N7", 7, 10, false), 10*time.Second).Status, "7 + 3 kept")
	r := admitIn(t, s, ucall("N1", 1, 10, false), 10*time.Second)
	assert.Equal(t, driver.StatusFull, r.Status, "7 + 3 kept + 1 over 10")
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "N7", Limit: 10}}}))
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("N6", 6, 10, false), 10*time.Second).Status)
	assert.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("N1", 1, 10, false), 10*time.Second).Status, "6 + 3 kept + 1")
	assert.Equal(t, driver.StatusFull, admitIn(t, s, ucall("N1b", 1, 10, false), 10*time.Second).Status, "7 + 3 kept + 1")
	countIs(t, s, "k", 7, "N6 and N1")
}

// A heavy waiter that fits by count but not beside the units an older
// urgent ticket keeps is heavy all the same: serving stops at it, and
// newcomers of 1 unit do not take the room it waits for.
func TestHeavyBesideAnUrgentTicket(t *testing.T) {
	s, admin := fastStore(t)
	urgentOnX(t, s, admin, 3)
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, ucall("N", 2, 10, false), 10*time.Second).Status)
	rh := admitIn(t, s, ucall("H", 6, 10, true), 10*time.Second)
	require.Equal(t, driver.StatusQueued, rh.Status, "2 + 3 kept + 6 over 10")
	for _, id := range []string{"L1", "L2", "L3"} {
		r := admitIn(t, s, ucall(id, 1, 10, false), 10*time.Second)
		assert.Equal(t, driver.StatusFull, r.Status, "%s: H waits for 6 units first (count %d)", id, r.Count)
	}
	countIs(t, s, "k", 2, "only N")
}

// urgentOnX makes U, a ticket of 3 units on "k" (limit 10) and "x" (limit
// xLimit), wait for "x", where X holds 1 unit, and marks it urgent, as
// registry.MaxPassed grants passing it over would.
func urgentOnX(t *testing.T, s driver.Store, admin *pgxpool.Pool, xLimit int) {
	t.Helper()
	x := ucall("X", 1, xLimit, false)
	x.Keys = []string{"x"}
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, x, 10*time.Second).Status)
	u := ucall("U", 3, 10, true)
	u.Keys, u.Limits = []string{"k", "x"}, []int{10, xLimit}
	require.Equal(t, driver.StatusQueued, admitIn(t, s, u, 10*time.Second).Status, "x: 1 + 3 over its limit")
	_, err := admin.Exec(context.Background(), "UPDATE inflight_ticket SET urgent = true WHERE fleet = $1 AND ticket = 'U'", fastFleet)
	require.NoError(t, err)
}
