package pgstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A differential check of the PostgreSQL store against memstore, the
// contract written out in Go: the same random driver calls on both, their
// answers, counts and queues compared, as redisstore's differential test
// does for Redis (its generator, adapted). PostgreSQL has no fake clock:
// the test replaces inflight_now_us() (every function of the schema reads
// its clock there) with a read of a table of its own, which it sets to
// memstore's clock at each step, so that both stores see the same time.
// One server for each test function; each seed runs in a fleet of its own.
//
// Knobs (environment): DIFF_SEEDS (how many runs; 4 by default, so that
// the normal suite stays short), DIFF_MULTI (tickets of two keys:
// memstore keeps no urgent places and serves in its own way where the
// contract leaves a store free, so some runs may differ by design),
// DIFF_LIGHTMULTI (those of one unit), DIFF_SHORT (claim windows that
// lapse, processes that die; the queues' lengths are not compared, as a
// store may keep a dead ticket until it meets it), DIFF_STARTS (compare
// the counts of learned keys), DIFF_KEYS (compare the key named and its
// count too), DIFF_CARRY (admissions that carry leases admitted while the
// store was unreachable), DIFF_BATCH (releases of two leases in one call),
// DIFF_SEED0 (the first seed), DIFF_TRACE (log every call of every run),
// DIFF_NOEPOCH (admissions without the epoch seen and a pause: the
// PostgreSQL store's fast paths for a waiter's ask and claim are not
// taken), DIFF_EPOCH (with DIFF_SHORT, admissions with them: DIFF_SHORT
// sends none by default). With the epoch, where the counts or queues
// differ after a step every waiter asks once (see settle in pgDiffRun)
// before they are compared: until then they differ by design.

// pgDiff runs the same driver calls on memstore and on the PostgreSQL
// store, on one clock, and compares what they answer.
type pgDiff struct {
	t     *testing.T
	now   time.Time
	m, r  driver.Store
	admin *pgxpool.Pool
	fleet string
	log   []string
	// epoch is the epoch the stores last told (the same on both: each
	// makes it from the clock they share).
	epoch int64
	// loose: admissions' replies are compared in their status only.
	loose bool
}

// pgDiffServer starts a server for a test function, with the clock its
// runs set.
func pgDiffServer(t *testing.T) (*pgtest.Server, *pgxpool.Pool) {
	srv := pgtest.Start(t)
	admin := pool(t, srv, 1)
	ctx := context.Background()
	// The schema first (New migrates it), then the clock replaced.
	_, err := pgstore.New(ctx, admin, "diff-setup")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE TABLE diff_clock (us bigint NOT NULL);
		INSERT INTO diff_clock VALUES (0);
		CREATE OR REPLACE FUNCTION inflight_now_us() RETURNS bigint LANGUAGE sql VOLATILE AS $$ SELECT us FROM diff_clock $$;`)
	require.NoError(t, err)
	return srv, admin
}

func newPgDiff(t *testing.T, srv *pgtest.Server, admin *pgxpool.Pool, fleet string) *pgDiff {
	p := &pgDiff{t: t, now: time.UnixMilli(1_800_000_000_000), admin: admin, fleet: fleet}
	p.m = memstore.NewWithClock(func() time.Time { return p.now })
	st, err := pgstore.New(context.Background(), pool(t, srv, 2), fleet)
	require.NoError(t, err)
	p.r = st
	p.setClock()
	if os.Getenv("DIFF_TRACE") != "" {
		t.Cleanup(func() {
			for _, l := range p.log {
				t.Log(l)
			}
		})
	}
	return p
}

func (p *pgDiff) setClock() {
	_, err := p.admin.Exec(context.Background(), "UPDATE diff_clock SET us = $1", p.now.UnixMicro())
	require.NoError(p.t, err)
}

func (p *pgDiff) advance(d time.Duration) {
	p.now = p.now.Add(d)
	p.setClock()
	p.logf("advance %v", d)
}

func (p *pgDiff) logf(f string, a ...any) { p.log = append(p.log, fmt.Sprintf(f, a...)) }

func (p *pgDiff) fail(f string, a ...any) {
	p.t.Helper()
	start := max(0, len(p.log)-400)
	for _, l := range p.log[start:] {
		p.t.Log(l)
	}
	p.dump()
	p.t.Fatalf(f, a...)
}

// dump logs the PostgreSQL store's tickets and leases.
func (p *pgDiff) dump() {
	ctx := context.Background()
	for _, q := range []string{
		"SELECT key || ' ' || ticket || ' u=' || units || ' r=' || rank || ' tag=' || tag || ' urgent=' || urgent || ' passed=' || passed_units || ' ' || expires FROM inflight_ticket WHERE fleet = $1 ORDER BY key, rank, tag, seq",
		"SELECT key || ' ' || lease || ' u=' || units || ' ' || expires FROM inflight_lease WHERE fleet = $1 ORDER BY key, lease",
	} {
		rows, err := p.admin.Query(ctx, q, p.fleet)
		if err != nil {
			p.t.Logf("dump: %v", err)
			continue
		}
		for rows.Next() {
			var s string
			_ = rows.Scan(&s)
			p.t.Log("pg ", s)
		}
		rows.Close()
	}
}

// queued is how many tickets wait in key's queue on PostgreSQL.
func (p *pgDiff) queued(key string) int {
	var n int
	require.NoError(p.t, p.admin.QueryRow(context.Background(), "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = $2",
		p.fleet, pgstore.StoredKey(key)).Scan(&n))
	return n
}

// leased reports whether lease is on key on PostgreSQL (expired or not).
func (p *pgDiff) leased(key, lease string) bool {
	var n int
	require.NoError(p.t, p.admin.QueryRow(context.Background(), "SELECT count(*) FROM inflight_lease WHERE fleet = $1 AND key = $2 AND lease = $3",
		p.fleet, pgstore.StoredKey(key), lease).Scan(&n))
	return n > 0
}

func (p *pgDiff) admit(c driver.AdmitCall) driver.AdmitResult {
	p.t.Helper()
	ctx := context.Background()
	c2 := c
	rm, err := p.m.AdmitOne(ctx, &c)
	if err != nil {
		p.fail("mem: %v", err)
	}
	rr, err := p.r.AdmitOne(ctx, &c2)
	if err != nil {
		p.fail("pg: %v", err)
	}
	p.logf("admit %s keys=%v lim=%v u=%d wait=%v cls=%d flow=%s proc=%s carried=%v -> mem %v/%d/%d/%d pg %v/%d/%d/%d", c.Lease[28:], c.Keys, c.Limits, c.Units, c.Wait, c.Class, c.Flow, c.Proc, c.Carried,
		rm.Status, rm.Key, rm.Count, rm.Queue, rr.Status, rr.Key, rr.Count, rr.Queue)
	if rm.Status == driver.StatusAdmitted && fmt.Sprint(rm.Counts) != fmt.Sprint(rr.Counts) {
		p.fail("admit %s counts: mem %v, pg %v", c.Lease, rm.Counts, rr.Counts)
	}
	if rm.Epoch != rr.Epoch {
		p.fail("admit %s epochs: mem %d, pg %d", c.Lease, rm.Epoch, rr.Epoch)
	}
	if rm.Epoch != 0 {
		p.epoch = rm.Epoch
	}
	if rm.Status != rr.Status {
		p.fail("admit %s: mem %+v, pg %+v", c.Lease, rm, rr)
	}
	if os.Getenv("DIFF_KEYS") != "" && !p.loose && (rm.Key != rr.Key || rm.Count != rr.Count) {
		// A waiter's ask that PostgreSQL answered on its fast path served
		// nothing where memstore's served: the counts differ after it, and
		// the reply's too (by design, see settle in pgDiffRun).
		if c.Epoch == 0 || rm.Status != driver.StatusQueued || p.differs("a")+p.differs("b") == "" {
			p.fail("admit %s: mem %+v, pg %+v", c.Lease, rm, rr)
		}
		p.logf("  (served on memstore only: the counts differ until a waiter with room asks)")
	}
	return rm
}

func (p *pgDiff) release(c driver.ReleaseCall) {
	p.t.Helper()
	ctx := context.Background()
	if err := p.m.Release(ctx, &c); err != nil {
		p.fail("mem: %v", err)
	}
	if err := p.r.Release(ctx, &c); err != nil {
		p.fail("pg: %v", err)
	}
	p.logf("release %+v", c.Pairs)
}

func (p *pgDiff) abandon(c driver.AbandonCall) {
	p.t.Helper()
	ctx := context.Background()
	if _, err := p.m.Abandon(ctx, []*driver.AbandonCall{&c}); err != nil {
		p.fail("mem: %v", err)
	}
	errs, err := p.r.Abandon(ctx, []*driver.AbandonCall{&c})
	if err != nil || errs[0] != nil {
		p.fail("pg: %v %v", err, errs)
	}
	p.logf("abandon %s %v %v", c.Lease[28:], c.Keys, c.Limits)
}

func (p *pgDiff) count(k string) {
	p.t.Helper()
	if d := p.differs(k); d != "" {
		p.fail("%s", d)
	}
}

// differs tells how the stores' counts of k, and its queues (but with
// DIFF_SHORT), differ ("": they do not).
func (p *pgDiff) differs(k string) string {
	p.t.Helper()
	ctx := context.Background()
	a, err := p.m.Count(ctx, k)
	if err != nil {
		p.fail("mem: %v", err)
	}
	b, err := p.r.Count(ctx, k)
	if err != nil {
		p.fail("pg: %v", err)
	}
	if a != b {
		return fmt.Sprintf("count %s: mem %d, pg %d", k, a, b)
	}
	if os.Getenv("DIFF_SHORT") == "" {
		if qm, qr := p.m.(*memstore.Store).Queued(k), p.queued(k); qm != qr {
			return fmt.Sprintf("queued on %s: mem %d, pg %d", k, qm, qr)
		}
	}
	return ""
}

func diffSeeds(t *testing.T) (from, n int) {
	n = 4
	if s := os.Getenv("DIFF_SEEDS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("DIFF_SEED0"); s != "" {
		from, _ = strconv.Atoi(s)
	}
	return from, n
}

// TestDifferential drives both stores with the same random calls on
// one or two keys, small queues, waiters of one process that never dies
// (of three that die, with DIFF_SHORT).
func TestDifferential(t *testing.T) {
	srv, admin := pgDiffServer(t)
	multi := os.Getenv("DIFF_MULTI") != ""
	from, n := diffSeeds(t)
	for seed := from; seed < from+n; seed++ {
		t.Run(strconv.Itoa(seed), func(t *testing.T) {
			pgDiffRun(newPgDiff(t, srv, admin, "d"+strconv.Itoa(seed)), uint64(seed), multi)
		})
	}
}

type pgDiffTicket struct {
	id    string
	keys  []string
	units int
	class uint8
	flow  string
	proc  string
	held  bool
}

func pgDiffRun(p *pgDiff, seed uint64, multi bool) {
	rng := rand.New(rand.NewPCG(seed, 7))
	limits := map[string]int{"a": 4, "b": 3}
	ttl, claim, live := time.Hour, time.Minute, 10*time.Hour
	short := os.Getenv("DIFF_SHORT") != ""
	// As the fleet's client sends them: the epoch last seen and a pause
	// (the PostgreSQL store's fast paths for asks and claims need both;
	// the epoch never changes here, so no pause is declared).
	pause := ttl
	if os.Getenv("DIFF_NOEPOCH") != "" || short && os.Getenv("DIFF_EPOCH") == "" {
		pause = 0
	}
	if short { // grants that lapse, processes that die
		claim, live = 10*time.Millisecond, 30*time.Millisecond
	}
	var tickets []*pgDiffTicket
	units := map[string]int{} // each lease id's units
	n := 0
	lims := func(keys []string) []int {
		out := make([]int, len(keys))
		for i, k := range keys {
			out[i] = limits[k]
		}
		return out
	}
	known := func() int64 {
		if pause == 0 {
			return 0
		}
		return p.epoch
	}
	call := func(tk *pgDiffTicket, wait bool) driver.AdmitCall {
		return driver.AdmitCall{Lease: tk.id, Keys: tk.keys, Limits: lims(tk.keys), Units: tk.units, TTL: ttl, Claim: claim,
			Live: live, Starts: os.Getenv("DIFF_STARTS") != "", Wait: wait, Epoch: known(), Pause: pause, Class: tk.class, Flow: tk.flow, Weight: 1, Proc: tk.proc, MaxQueue: -1, MaxFlowQueue: -1}
	}
	over := func(tk *pgDiffTicket) bool {
		for _, l := range lims(tk.keys) {
			if l > 0 && tk.units > l {
				return true
			}
		}
		return false
	}
	drop := func(tk *pgDiffTicket) {
		if i := slices.Index(tickets, tk); i >= 0 {
			tickets = slices.Delete(tickets, i, i+1)
		}
	}
	// settle has each waiter ask once, as each does within a claim
	// window, their replies compared in their status only. A claim may
	// skip serving (driver.AdmitCall step 5), and on PostgreSQL so does
	// the ask of a waiter that has no room on any of its keys (its fast
	// path, PROTOCOL.md: with the epoch it saw and a pause), where
	// memstore serves on every ask: room that no release freed (a raised
	// limit, a newcomer queued behind a heavy waiter at its bound, a
	// lapsed grant) is served on PostgreSQL only by the ask of a waiter
	// that has room for it, and until that waiter asks the counts differ
	// by design.
	settle := func() {
		p.logf("settle")
		p.loose = true
		defer func() { p.loose = false }()
		for _, tk := range slices.Clone(tickets) {
			if tk.held || p.leased(tk.keys[0], tk.id) || over(tk) {
				continue
			}
			switch p.admit(call(tk, true)).Status {
			case driver.StatusAdmitted:
				tk.held = true
			case driver.StatusQueued:
			default:
				drop(tk)
			}
		}
	}
	for step := 0; step < 150; step++ {
		switch op := rng.IntN(10); {
		case op < 3 && len(tickets) < 30: // a newcomer
			n++
			keys := []string{"a"}
			if multi && rng.IntN(4) == 0 {
				keys = []string{"a", "b"}
			}
			tk := &pgDiffTicket{id: fmt.Sprintf("%032x", n), keys: keys, units: 1 + rng.IntN(3), class: uint8(rng.IntN(2)), flow: "f" + strconv.Itoa(rng.IntN(2)), proc: "proc"}
			if short {
				tk.proc = "p" + strconv.Itoa(rng.IntN(3))
			}
			for _, l := range lims(keys) {
				if l > 0 {
					tk.units = min(tk.units, l) // the client never sends more (0: a paused key)
				}
			}
			if len(keys) > 1 && os.Getenv("DIFF_LIGHTMULTI") != "" {
				tk.units = 1
			}
			wait := rng.IntN(4) > 0
			c := call(tk, wait)
			if os.Getenv("DIFF_CARRY") != "" && rng.IntN(3) == 0 {
				// A lease admitted while the store was unreachable comes in
				// with this call (or an abandoned id's: it stays out).
				n++
				d := &pgDiffTicket{id: fmt.Sprintf("%032x", n), keys: []string{"a"}, units: 1 + rng.IntN(3), held: true, proc: tk.proc}
				c.Carried = []driver.Pair{{Key: "a", Lease: d.id, Units: d.units}}
				if other := fmt.Sprintf("%032x", 1+rng.IntN(n)); rng.IntN(3) == 0 && other != c.Lease && other != d.id {
					// Its own units: a lease id weighs the same in every
					// call (on a lease there already with other units,
					// memstore and Redis weigh the pair's, PostgreSQL
					// keeps the lease's own; the contract does not say).
					c.Carried = append(c.Carried, driver.Pair{Key: "a", Lease: other, Units: units[other]})
				}
				tickets = append(tickets, d)
				units[d.id] = d.units
			}
			units[tk.id] = tk.units
			switch p.admit(c).Status {
			case driver.StatusAdmitted:
				tk.held = true
				tickets = append(tickets, tk)
			case driver.StatusQueued:
				tickets = append(tickets, tk)
			}
		case op < 5 && len(tickets) > 0: // a waiter asks (or claims)
			tk := tickets[rng.IntN(len(tickets))]
			if tk.held {
				continue
			}
			if over(tk) { // the client refuses it: it withdraws
				p.abandon(driver.AbandonCall{Lease: tk.id, Keys: tk.keys, Limits: lims(tk.keys), TTL: ttl, Claim: claim})
				drop(tk)
				continue
			}
			switch p.admit(call(tk, true)).Status {
			case driver.StatusAdmitted:
				tk.held = true
			case driver.StatusQueued:
			default:
				drop(tk)
			}
		case op < 7 && len(tickets) > 0: // a holder releases
			tk := tickets[rng.IntN(len(tickets))]
			if !tk.held {
				continue
			}
			var pairs []driver.Release
			for _, k := range tk.keys {
				pairs = append(pairs, driver.Release{Key: k, Lease: tk.id, Limit: limits[k]})
			}
			if o := tickets[rng.IntN(len(tickets))]; os.Getenv("DIFF_BATCH") != "" && o.held && o != tk {
				for _, k := range o.keys { // a batch: two leases' removals in one call
					pairs = append(pairs, driver.Release{Key: k, Lease: o.id, Limit: limits[k] + rng.IntN(2)})
				}
				drop(o)
			}
			p.release(driver.ReleaseCall{TTL: ttl, Claim: claim, Pairs: pairs})
			drop(tk)
		case op == 7 && len(tickets) > 0: // a waiter gives up
			tk := tickets[rng.IntN(len(tickets))]
			if tk.held {
				continue
			}
			p.abandon(driver.AbandonCall{Lease: tk.id, Keys: tk.keys, Limits: lims(tk.keys), TTL: ttl, Claim: claim})
			drop(tk)
		case op == 8: // a limit changes
			k := []string{"a", "b"}[rng.IntN(2)]
			limits[k] = rng.IntN(7)
			p.logf("limit %s = %d", k, limits[k])
			// A claim may skip serving (driver.AdmitCall step 5): the
			// waiters ask, and serve the room a raised limit makes.
			settle()
		default:
			p.advance(time.Duration(1+rng.IntN(5)) * time.Millisecond)
		}
		if pause != 0 && p.differs("a")+p.differs("b") != "" {
			settle()
		}
		p.count("a")
		p.count("b")
	}
}

// TestDifferentialRenew drives one key (two for some leases) with
// admissions, renewals (of held and of released leases), expiries and
// losses of the store's data.
func TestDifferentialRenew(t *testing.T) {
	srv, admin := pgDiffServer(t)
	from, n := diffSeeds(t)
	for seed := from; seed < from+n; seed++ {
		t.Run(strconv.Itoa(seed), func(t *testing.T) {
			pgDiffRenewRun(newPgDiff(t, srv, admin, "r"+strconv.Itoa(seed)), uint64(seed))
		})
	}
}

type pgDiffLease struct {
	id       string
	keys     []string
	units    int
	em, er   int64 // the epoch each store last told it in
	released bool
}

const pgDiffTTL = 15 * time.Millisecond

func pgDiffLims(keys []string, limit int) []int {
	out := []int{limit}
	if len(keys) > 1 {
		out = append(out, limit+1)
	}
	return out
}

func pgDiffRenewRun(p *pgDiff, seed uint64) {
	t := p.t
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 11))
	limit := 4
	var em, er int64 // the epochs the caller last saw
	var leases []*pgDiffLease
	lost := false // the stores lost their data, and no admission or renewal came since
	n := 0
	const pause = 20 * time.Millisecond
	for step := 0; step < 120; step++ {
		switch op := rng.IntN(12); {
		case op < 4:
			n++
			l := &pgDiffLease{id: fmt.Sprintf("%032x", n), units: min(1+rng.IntN(3), max(limit, 1)), keys: []string{"a"}}
			if rng.IntN(3) == 0 {
				l.keys = []string{"a", "b"}
			}
			c := driver.AdmitCall{Lease: l.id, Keys: l.keys, Limits: pgDiffLims(l.keys, limit), Units: l.units, TTL: pgDiffTTL, Claim: time.Minute,
				Live: time.Hour, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1, Pause: pause}
			cm, cr := c, c
			cm.Epoch, cr.Epoch = em, er
			rm, err := p.m.AdmitOne(ctx, &cm)
			require.NoError(t, err)
			rr, err := p.r.AdmitOne(ctx, &cr)
			require.NoError(t, err)
			p.logf("admit %s keys=%v u=%d lim=%d epoch=%d/%d -> mem %v/%d/%d pg %v/%d/%d", l.id[30:], l.keys, l.units, limit, em, er, rm.Status, rm.Count, rm.Epoch, rr.Status, rr.Count, rr.Epoch)
			if rm.Status != rr.Status {
				p.fail("admit: mem %+v pg %+v", rm, rr)
			}
			em, er, lost = rm.Epoch, rr.Epoch, false
			if rm.Status == driver.StatusAdmitted {
				l.em, l.er = rm.Epoch, rr.Epoch
				leases = append(leases, l)
			}
		case op < 7 && len(leases) > 0:
			var ls []*pgDiffLease
			for _, l := range leases {
				if rng.IntN(2) == 0 {
					ls = append(ls, l)
				}
			}
			mk := func(known func(*pgDiffLease) int64, ep int64) *driver.RenewCall {
				c := &driver.RenewCall{TTL: pgDiffTTL, Epoch: ep, Pause: pause}
				for _, l := range ls {
					c.Leases = append(c.Leases, driver.Renewal{Lease: l.id, Units: l.units, Mode: driver.ModeReassert, Epoch: known(l),
						Keys: l.keys, Limits: pgDiffLims(l.keys, limit)})
				}
				return c
			}
			rm, err := p.m.Renew(ctx, mk(func(l *pgDiffLease) int64 { return l.em }, em))
			require.NoError(t, err)
			rr, err := p.r.Renew(ctx, mk(func(l *pgDiffLease) int64 { return l.er }, er))
			require.NoError(t, err)
			var ids []string
			for _, l := range ls {
				ids = append(ids, fmt.Sprintf("%s(r=%v)", l.id[30:], l.released))
			}
			p.logf("renew %v lim=%d -> mem %v pg %v", ids, limit, rm.Leases, rr.Leases)
			if fmt.Sprint(rm.Leases) != fmt.Sprint(rr.Leases) || rm.TooLate != rr.TooLate {
				p.fail("renew: mem %+v pg %+v", rm, rr)
			}
			em, er, lost = rm.Epoch, rr.Epoch, false
			for i, l := range ls {
				if rm.Leases[i] != driver.FateGone {
					l.em, l.er = rm.Epoch, rr.Epoch
				}
			}
		case op < 9 && len(leases) > 0:
			l := leases[rng.IntN(len(leases))]
			if lost {
				// The first call after a loss: on PostgreSQL a release
				// makes the new epoch too (its marker missing), and the
				// pause an admission declares then counts from the
				// release; memstore and Redis make it at the admission
				// (by design: whichever call comes first).
				p.logf("release of %s skipped", l.id[30:])
				continue
			}
			var pairs []driver.Release
			for _, k := range l.keys {
				pairs = append(pairs, driver.Release{Key: k, Lease: l.id, Limit: limit})
			}
			p.release(driver.ReleaseCall{TTL: pgDiffTTL, Claim: time.Minute, Pairs: pairs})
			l.released = true
		case op == 9:
			limit = 1 + rng.IntN(6)
			p.logf("limit %d", limit)
		case op == 10 && rng.IntN(4) == 0:
			p.m.(*memstore.Store).Lose()
			for _, tbl := range []string{"fleet", "marker", "key", "lease", "ticket", "flow", "proc", "tomb"} {
				_, err := p.admin.Exec(ctx, "DELETE FROM inflight_"+tbl+" WHERE fleet = $1", p.fleet)
				require.NoError(t, err)
			}
			p.logf("lose")
			lost = true
			p.advance(time.Millisecond) // a new epoch is another µs
		default:
			p.advance(time.Duration(1+rng.IntN(12)) * time.Millisecond)
		}
		p.count("a")
		p.count("b")
	}
}

// TestDifferentialBudget drives one budget with charges, corrections and
// moves on both stores.
func TestDifferentialBudget(t *testing.T) {
	srv, admin := pgDiffServer(t)
	from, n := diffSeeds(t)
	for seed := from; seed < from+n; seed++ {
		t.Run(strconv.Itoa(seed), func(t *testing.T) {
			p := newPgDiff(t, srv, admin, "b"+strconv.Itoa(seed))
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(seed), 3))
			var steps []int64
			for i := 0; i < 150; i++ {
				c := driver.BudgetCall{Key: "b", Limits: [3]int64{int64(rng.IntN(40)), int64(rng.IntN(30)), int64(rng.IntN(30))}}
				for j := range c.Cost {
					c.Cost[j] = int64(rng.IntN(12))
				}
				switch rng.IntN(5) {
				case 0, 1:
				case 2:
					if len(steps) == 0 {
						continue
					}
					c.Correct, c.Step = true, steps[rng.IntN(len(steps))]
					for j := range c.Cost {
						c.Cost[j] -= 6
					}
				case 3:
					if len(steps) == 0 {
						continue
					}
					c.Correct, c.Move, c.Step = true, true, steps[rng.IntN(len(steps))]
				default:
					p.advance(time.Duration(rng.IntN(30000)) * time.Millisecond)
					continue
				}
				rm, err := p.m.Budget(ctx, &c)
				require.NoError(t, err)
				rr, err := p.r.Budget(ctx, &c)
				require.NoError(t, err)
				p.logf("budget %+v -> mem %+v pg %+v", c, rm, rr)
				if rm != rr {
					p.fail("budget: mem %+v pg %+v", rm, rr)
				}
				if rm.Charged && !c.Correct {
					steps = append(steps, rm.Step)
				}
			}
		})
	}
}
