package pgstore_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Revision 25's inflight_serve and inflight_room against the ones they
// replace, on the same random state of a key's queue and leases: each
// state is made in a transaction, served (as a release of n pairs on the
// key serves it) and rolled back, once with revision 25's functions and
// once with those before it (made again inside the transaction), and the
// answers and every table serving writes are compared. SERVEDIFF_STATES
// says how many states (300 by default).
func TestServeReadsAgainstBefore(t *testing.T) {
	srv := pgtest.Start(t)
	p := pool(t, srv, 1)
	ctx := context.Background()
	_, err := pgstore.New(ctx, p, "setup")
	require.NoError(t, err)
	n := 300
	if s := os.Getenv("SERVEDIFF_STATES"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for seed := range n {
		st := randomServeState(uint64(seed))
		now := run25(t, p, st, false)
		before := run25(t, p, st, true)
		if os.Getenv("SERVEDIFF_LOG") != "" {
			t.Logf("seed %d: %d statements\n%s", seed, len(st.stmts), strings.SplitN(now, "room", 2)[0])
		}
		if now != before {
			t.Fatalf("seed %d: state\n%s\nrevision 25:\n%s\nbefore:\n%s", seed, strings.Join(st.stmts, "\n"), now, before)
		}
	}
}

type serveState struct {
	stmts  []string
	lim    int
	olim   int
	pairs  int
	sweeps []int // limits of later servings in the same call
}

const sdNow = 1_000_000

func randomServeState(seed uint64) serveState {
	r := rand.New(rand.NewPCG(seed, 25))
	st := serveState{lim: 1 + r.IntN(8), olim: 1 + r.IntN(8), pairs: 1 + r.IntN(3)}
	add := func(f string, a ...any) { st.stmts = append(st.stmts, fmt.Sprintf(f, a...)) }
	add(`INSERT INTO inflight_key (fleet, key) VALUES ('sd', 'k'), ('sd', 'o')`)
	add(`INSERT INTO inflight_proc (fleet, proc, alive_until) VALUES ('sd', 'live', %d), ('sd', 'dead', 0), ('sd', 'edge', %d)`,
		sdNow+10_000_000, sdNow+int(1.5*1000)) // edge: dead by 1.5 claims exactly
	rare := 15 // how rarely a waiter is dead, expired, urgent, near its bound
	if r.IntN(2) == 0 {
		rare = 200 // long runs of heavy waiters, to the look bound
		st.lim = max(st.lim, 2)
	}
	for key, lim := range map[string]int{"k": st.lim, "o": st.olim} {
		for i := range r.IntN(4) {
			if key == "k" && rare > 15 {
				break
			}
			exp := sdNow + 1 + r.IntN(1000)
			switch r.IntN(4) {
			case 0:
				exp = sdNow - r.IntN(1000) // expired (at now exactly, sometimes)
			case 1:
				exp = sdNow
			}
			add(`INSERT INTO inflight_lease (fleet, key, lease, expires, units) VALUES ('sd', '%s', 'l%s%d', %d, %d)`,
				key, key, i, exp, 1+r.IntN(max(1, lim)))
		}
	}
	// Queues long enough to reach the look bound, mostly heavy waiters.
	nt := r.IntN(12)
	if r.IntN(3) == 0 {
		nt = driver.PassScan - 3 + r.IntN(8)
	}
	if r.IntN(6) == 0 {
		nt = 4*driver.PassScan - 4 + r.IntN(10)
	}
	if rare > 15 && r.IntN(2) == 0 {
		nt = driver.PassScan + r.IntN(5) - 2 // the look bound's edge
	}
	heavyBias := r.IntN(3) // 0: random units; else mostly heavy
	deadRun := 0           // the first deadRun waiters dead (looks that count towards 4 * PassScan, not PassScan)
	if rare > 15 && r.IntN(3) == 0 {
		deadRun = 4*driver.PassScan - driver.PassScan/2 + r.IntN(driver.PassScan)
		nt = deadRun + driver.PassScan/2 + r.IntN(driver.PassScan)
	}
	if rare > 15 {
		add(`INSERT INTO inflight_lease (fleet, key, lease, expires, units) VALUES ('sd', 'k', 'lk-held', %d, 1)`, sdNow+5000)
	}
	for i := range nt {
		units := 1 + r.IntN(st.lim+1)
		if heavyBias > 0 && r.IntN(8) > 0 {
			units = max(1, st.lim-r.IntN(2))
		}
		if rare > 15 && r.IntN(rare) > 0 {
			units = st.lim
		}
		keys, limits := "{k}", fmt.Sprintf("{%d}", st.lim+r.IntN(2)-1)
		multi := r.IntN(rare) == 0
		if multi {
			keys, limits = "{k,o}", fmt.Sprintf("{%d,%d}", st.lim, st.olim)
		}
		proc := "live"
		switch r.IntN(rare) {
		case 0:
			proc = "dead"
		case 1:
			proc = "gone"
		case 2:
			proc = "edge"
		}
		if i < deadRun && r.IntN(8) > 0 {
			proc = "dead"
		}
		exp := sdNow + 100_000
		if r.IntN(rare) == 0 {
			exp = sdNow - r.IntN(2)
		}
		passedUnits := 0
		if r.IntN(rare/4+1) == 0 {
			passedUnits = driver.PassFactor*units - r.IntN(3)
		}
		passed := 0
		if r.IntN(rare/4+1) == 0 {
			passed = 8 - r.IntN(3)
		}
		urgent := r.IntN(rare) == 0
		rank := r.IntN(3)
		tag := float64(r.IntN(20)) / 2
		flow := "f" + strconv.Itoa(r.IntN(3))
		row := func(key string) {
			add(`INSERT INTO inflight_ticket (fleet, key, ticket, rank, tag, seq, proc, flow, arrival, finish, passed, urgent, keys, limits, expires, units, passed_units)
				VALUES ('sd', '%s', 't%03d', %d, %v, %d, '%s', '%s', %d, %v, %d, %v, '%s', '%s', %d, %d, %d)`,
				key, i, rank, tag, i, proc, flow, 1000+i, tag+1, passed, urgent, keys, limits, exp, units, passedUnits)
		}
		row("k")
		if multi {
			row("o")
		}
	}
	add(`INSERT INTO inflight_flow (fleet, key, rank, flow, finish, base, n)
		SELECT fleet, key, rank, flow, max(finish), NULL, count(*) FROM inflight_ticket WHERE fleet = 'sd' GROUP BY 1, 2, 3, 4`)
	if r.IntN(2) == 0 { // a newcomer's admission that may pass a heavy waiter serves so
		add(`SELECT set_config('inflight.pass', 'on', true)`)
	}
	for range r.IntN(3) {
		st.sweeps = append(st.sweeps, 1+r.IntN(8))
	}
	return st
}

// run25 makes st in a transaction, serves k as a release of st.pairs
// pairs on it would, and asks o's room; it returns the answers and the
// tables, and rolls back.
func run25(t *testing.T, p interface {
	Begin(context.Context) (pgx.Tx, error)
}, st serveState, before bool) string {
	ctx := context.Background()
	tx, err := p.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	if before {
		_, err := tx.Exec(ctx, pgstore.ServeBefore25)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, pgstore.RoomBefore25)
		require.NoError(t, err)
	}
	for _, s := range st.stmts {
		_, err := tx.Exec(ctx, s)
		require.NoError(t, err, s)
	}
	var out strings.Builder
	serve := func(lim, pairs int) {
		var r int
		require.NoError(t, tx.QueryRow(ctx, `SELECT inflight_serve('sd', 'k', $1, $2, 1000, 0)`, lim, sdNow).Scan(&r))
		fmt.Fprintf(&out, "serve %d -> %d", lim, r)
		for ; r > 0 && pairs > 1; pairs-- {
			require.NoError(t, tx.QueryRow(ctx, `SELECT inflight_serve('sd', 'k', $1, $2, 1000, $3)`, lim, sdNow, r-1).Scan(&r))
			fmt.Fprintf(&out, " -> %d", r)
		}
		out.WriteString("\n")
	}
	serve(st.lim, st.pairs)
	for _, l := range st.sweeps {
		serve(l, 2)
	}
	var room int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT inflight_room('sd', 'o', $1, NULL, NULL, $2, 1000)`, st.olim, sdNow).Scan(&room))
	fmt.Fprintf(&out, "room o %d\n", room)
	writeRows(t, tx, &out,
		`SELECT key, ticket, passed, urgent, passed_units, expires FROM inflight_ticket WHERE fleet = 'sd' ORDER BY 1, 2`,
		`SELECT key, lease, expires, units, granted FROM inflight_lease WHERE fleet = 'sd' ORDER BY 1, 2`,
		`SELECT key, vt::text, seq FROM inflight_key WHERE fleet = 'sd' ORDER BY 1`,
		`SELECT key, rank, flow, finish, base, n FROM inflight_flow WHERE fleet = 'sd' ORDER BY 1, 2, 3`,
		`SELECT coalesce(current_setting('inflight.looked', true), '')`)
	return out.String()
}

// writeRows writes to out the rows each of queries reads in tx, a line a
// row: what a differential test compares of the tables a call writes.
func writeRows(t *testing.T, tx pgx.Tx, out io.Writer, queries ...string) {
	t.Helper()
	for _, q := range queries {
		rows, err := tx.Query(context.Background(), q)
		require.NoError(t, err)
		for rows.Next() {
			v, err := rows.Values()
			require.NoError(t, err)
			fmt.Fprintln(out, v...)
		}
		require.NoError(t, rows.Err())
	}
}
