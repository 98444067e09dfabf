package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Revision 26's inflight_admit and inflight_still_queued against the
// ones they replace, on the same random states (the serving test's
// queues and leases, with a fleet whose epoch the calls know or not, a
// silence, a pause): each state is made in a transaction, with the
// database's clock stopped at sdNow, a run of admissions, waiters'
// asks, holders' calls again and asks answered without the keys' locks
// is made on it, and it is rolled back, once with revision 26's
// functions and once with those before it (made again inside the
// transaction); the answers and every table the calls write are
// compared. ADMITDIFF_STATES says how many states (600 by default: some
// of the paths it compares, a waiter of two keys named by its second,
// show in one state of a few hundred).
func TestAdmitReadsAgainstBefore(t *testing.T) {
	srv := pgtest.Start(t)
	p := pool(t, srv, 1)
	ctx := context.Background()
	_, err := pgstore.New(ctx, p, "setup")
	require.NoError(t, err)
	n := 600
	if s := os.Getenv("ADMITDIFF_STATES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for seed := range n {
		st := randomAdmitState(uint64(seed))
		now := run26(t, p, st, false)
		before := run26(t, p, st, true)
		if now != before {
			t.Fatalf("seed %d: state\n%s\ncalls\n%s\nrevision 26:\n%s\nbefore:\n%s", seed, strings.Join(st.stmts, "\n"),
				strings.Join(st.calls, "\n"), now, before)
		}
	}
}

// sdEpoch is the fleet's epoch in the states (microseconds).
const sdEpoch = (sdNow - 60_000) * 1000

type admitState struct {
	stmts []string
	calls []string // each a statement that returns a bigint[]
}

func randomAdmitState(seed uint64) admitState {
	r := rand.New(rand.NewPCG(seed, 26))
	ss := randomServeState(seed)
	st := admitState{stmts: ss.stmts}
	add := func(f string, a ...any) { st.stmts = append(st.stmts, fmt.Sprintf(f, a...)) }
	heard := sdNow - r.IntN(3000) // within ttl/2 of now, mostly
	if r.IntN(8) == 0 {
		heard = sdNow - 40_000 // a silence, for a ttl of 30 s
	}
	pauseUntil := 0
	if r.IntN(8) == 0 {
		pauseUntil = sdNow + 5000
	}
	add(`INSERT INTO inflight_fleet (fleet, epoch, pause_until, last_pause, last_ttl, heard) VALUES ('sd', %d, %d, 5000, 30000, %d)`,
		sdEpoch, pauseUntil, heard)
	if r.IntN(10) > 0 {
		add(`INSERT INTO inflight_marker (fleet, epoch) VALUES ('sd', %d)`, sdEpoch)
	}
	if r.IntN(6) == 0 {
		add(`INSERT INTO inflight_tomb (fleet, lease, until) VALUES ('sd', 'lk0', %d)`, sdNow+1000)
	}
	if r.IntN(2) == 0 {
		// A ticket of both keys at the head of k's queue or at its end,
		// alone on o's unless o had some, and an expired lease on o:
		// serving k may take o's last ticket out before o is served.
		proc := []string{"dead", "live", "live"}[r.IntN(3)]
		tag := []int{-1, 50}[r.IntN(2)]
		keys, limits := "{k,o}", fmt.Sprintf("{%d,%d}", ss.lim, ss.olim)
		if r.IntN(2) == 0 {
			keys, limits = "{o,k}", fmt.Sprintf("{%d,%d}", ss.olim, ss.lim)
		}
		units := 1 + r.IntN(2)
		for _, key := range []string{"k", "o"} {
			add(`INSERT INTO inflight_ticket (fleet, key, ticket, rank, tag, seq, proc, flow, arrival, finish, keys, limits, expires, units)
				VALUES ('sd', '%s', 'tx', 0, %d, %d, '%s', 'fx', 999, 0, '%s', '%s', %d, %d)`, key, tag, tag, proc, keys, limits, sdNow+100_000, units)
		}
		add(`INSERT INTO inflight_flow (fleet, key, rank, flow, finish, base, n) VALUES ('sd', 'k', 0, 'fx', 0, NULL, 1), ('sd', 'o', 0, 'fx', 0, NULL, 1)`)
		add(`INSERT INTO inflight_lease (fleet, key, lease, expires, units) VALUES ('sd', 'o', 'lo-exp', %d, 1)`, sdNow-r.IntN(2))
	}
	ticket := func() string {
		if r.IntN(2) == 0 {
			return "tx"
		}
		return fmt.Sprintf("t%03d", r.IntN(12))
	}
	keySets := []struct{ keys, limits string }{
		{"{k}", fmt.Sprintf("{%d}", ss.lim)},
		{"{k}", fmt.Sprintf("{%d}", max(1, ss.lim-1))}, // a limit lowered
		{"{o}", fmt.Sprintf("{%d}", ss.olim)},
		{"{k,o}", fmt.Sprintf("{%d,%d}", ss.lim, ss.olim)},
		{"{o,k}", fmt.Sprintf("{%d,%d}", ss.olim, ss.lim)},
	}
	known := func() int {
		if r.IntN(6) == 0 {
			return r.IntN(2) * 12345 // none, or another epoch
		}
		return sdEpoch
	}
	claim := func() int {
		if r.IntN(10) == 0 {
			return 0 // a grant expired as it is made
		}
		return 1000
	}
	admit := func(l, keys, limits string, wait bool, units int, carried string) {
		notAfter := 0
		if r.IntN(15) == 0 {
			notAfter = sdNow - 1
		}
		pause := 0
		if r.IntN(4) == 0 {
			pause = 5000
		}
		maxQ, maxF := -1, -1
		if r.IntN(5) == 0 {
			maxQ, maxF = r.IntN(6), r.IntN(4)
		}
		ck, cl, cu := "NULL", "NULL", "NULL"
		if carried != "" {
			ck, cl, cu = "'{o}'", "'{"+carried+"}'", fmt.Sprintf("'{%d}'", 1+r.IntN(3))
		}
		proc := []string{"live", "live", "newp", "dead"}[r.IntN(4)]
		st.calls = append(st.calls, fmt.Sprintf(`SELECT inflight_admit('sd', '%s', '%s', '%s', 30000, %d, %d, %d, %v, %v, %d, %d::smallint, 'f%d', 1, '%s', %d, %d, 5000, false, %s, %s, %d, %s)`,
			l, keys, limits, notAfter, known(), pause, wait, r.IntN(2) == 0, claim(), r.IntN(3), r.IntN(3), proc, maxQ, maxF, ck, cl, units, cu))
	}
	for i := range 2 + r.IntN(6) {
		ks := keySets[r.IntN(len(keySets))]
		switch r.IntN(5) {
		case 0, 1: // a newcomer
			carried := ""
			if r.IntN(6) == 0 {
				carried = "lo0"
			}
			admit(fmt.Sprint("n", i), ks.keys, ks.limits, r.IntN(3) > 0, 1+r.IntN(ss.lim+1), carried)
		case 2: // a queued ticket asks again, on its keys and limits as queued (run26 reads them)
			admit(ticket(), "{{keys}}", "{{limits}}", true, 1, "")
		case 3: // a holder's call made again (a claim on the whole path), its limit as given
			admit([]string{"lk0", "lk1", "lk-held", "lo0"}[r.IntN(4)], ks.keys, ks.limits, r.IntN(2) == 0, 1, "")
		case 4: // a queued ticket's ask answered without the keys' locks
			st.calls = append(st.calls, fmt.Sprintf(`SELECT inflight_still_queued('sd', '%s', '{{keys}}', '{{limits}}', 30000, 0, %d, 0, 'live', 5000)`,
				ticket(), known()))
		}
	}
	return st
}

// run26 makes st in a transaction with the clock at sdNow, makes its
// calls, and returns their answers and the tables; it rolls back.
func run26(t *testing.T, p interface {
	Begin(context.Context) (pgx.Tx, error)
}, st admitState, before bool) string {
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	if before {
		_, err := tx.Exec(ctx, pgstore.AdmitBefore26)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, pgstore.StillQueuedBefore26)
		require.NoError(t, err)
	}
	// The sequence of arrivals is not rolled back: each run starts it
	// from the same value.
	for _, s := range []string{`SELECT setval('inflight_arrival', 1000000)`,
		fmt.Sprintf(`CREATE OR REPLACE FUNCTION inflight_now_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$ SELECT %d::bigint $$`, sdNow*1000)} {
		_, err := tx.Exec(ctx, s)
		require.NoError(t, err)
	}
	for _, s := range st.stmts {
		_, err := tx.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	var out strings.Builder
	for _, c := range st.calls {
		// A ticket's ask takes its keys and limits as queued (its first
		// row), or k's if it is gone.
		if strings.Contains(c, "{{keys}}") {
			var keys, limits string
			err := tx.QueryRow(ctx, `SELECT coalesce((SELECT keys::text || ' ' || limits::text FROM inflight_ticket
				WHERE fleet = 'sd' AND ticket = $1 ORDER BY key LIMIT 1), '{k} {3}')`, strings.Split(c, "'")[3]).Scan(&keys)
			require.NoError(t, err)
			keys, limits, _ = strings.Cut(keys, " ")
			c = strings.NewReplacer("{{keys}}", keys, "{{limits}}", limits).Replace(c)
		}
		var res []int64
		_, err := tx.Exec(ctx, "SAVEPOINT c")
		require.NoError(t, err)
		if err := tx.QueryRow(ctx, c).Scan(&res); err != nil {
			fmt.Fprintf(&out, "%s\n -> error %v\n", c, err)
			_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT c")
			require.NoError(t, err)
			continue
		}
		fmt.Fprintf(&out, "%s\n -> %v\n", c, res)
	}
	writeRows(t, tx, &out,
		`SELECT key, ticket, passed, urgent, passed_units, expires, limits::text, arrival FROM inflight_ticket WHERE fleet = 'sd' ORDER BY 1, 2`,
		`SELECT key, lease, expires, units, granted, graced FROM inflight_lease WHERE fleet = 'sd' ORDER BY 1, 2`,
		`SELECT key, vt::text, seq FROM inflight_key WHERE fleet = 'sd' ORDER BY 1`,
		`SELECT key, rank, flow, finish, base, n FROM inflight_flow WHERE fleet = 'sd' ORDER BY 1, 2, 3`,
		`SELECT proc, alive_until FROM inflight_proc WHERE fleet = 'sd' ORDER BY 1`,
		`SELECT epoch, pause_until, last_pause, last_ttl, heard, grace_from, grace_until FROM inflight_fleet WHERE fleet = 'sd'`,
		`SELECT coalesce(current_setting('inflight.looked', true), ''), coalesce(current_setting('inflight.pass', true), '')`)
	return out.String()
}
