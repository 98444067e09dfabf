// Package storediff is the differential check of a fleet store against
// memstore, the contract written out in Go: the same random driver calls
// on both, on one clock, their answers, counts and queues compared. The
// differential tests of redisstore and pgstore run it, each with a Side
// for its store.
//
// Knobs (environment; each test says which it honours):
//
//   - DIFF_SEEDS: how many runs (each test sets its default).
//   - DIFF_SEED0: the first seed.
//   - DIFF_MULTI: tickets of two keys. memstore keeps no urgent places and
//     serves in its own way where the contract leaves a store free (it may
//     serve a claim where another store may skip it), so some runs may
//     differ by design.
//   - DIFF_LIGHTMULTI: those of one unit.
//   - DIFF_SHORT: claim windows that lapse, processes that die. The
//     queues' lengths are not compared, as a store may keep a dead ticket
//     until it meets it (dead tickets behind a heavy head wait in Redis,
//     documented).
//   - DIFF_STARTS: compare the counts of learned keys.
//   - DIFF_KEYS: compare the key named and its count too.
//   - DIFF_CARRY: admissions that carry leases admitted while the store
//     was unreachable.
//   - DIFF_BATCH: releases of two leases in one call.
//   - DIFF_TRACE: log more (what, the Side says).
//   - DIFF_NOEPOCH (with Config.Epochs): admissions without the epoch seen
//     and a pause (the PostgreSQL store's fast paths for a waiter's ask and
//     claim are not taken).
//   - DIFF_EPOCH (with Config.Epochs and DIFF_SHORT): admissions with
//     them; DIFF_SHORT sends none by default. With the epoch, where the
//     counts or queues differ after a step every waiter asks once (see
//     settle in Run) before they are compared: until then they differ by
//     design.
//
// A Side may read knobs of its own (redisstore: DIFF_REAL).
package storediff

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// Side is the store-specific side of a Pair: the store under test and
// what the runs read of it beyond the driver.
type Side interface {
	// Name names the store in messages ("redis", "pg").
	Name() string
	// Store is the store under test.
	Store() driver.Store
	// SetClock moves the store's clock by d, to now (memstore's).
	SetClock(now time.Time, d time.Duration)
	// Queued is how many tickets wait in key's queue on the store.
	Queued(key string) int
	// Leased reports whether lease is on key on the store (expired or not).
	Leased(key, lease string) bool
	// Lose has the store lose its data (as memstore.Store.Lose does).
	Lose()
	// Dump logs the store's queues and leases, when a run fails.
	Dump()
}

// Checker is a Side that checks the store after every step of Run (the
// counts and queues compared first).
type Checker interface {
	Check(p *Pair, key string)
}

// Tracer is a Side that logs more after each admission, with DIFF_TRACE.
type Tracer interface {
	Trace(p *Pair)
}

// Config says where a store's side of the runs differs from another's
// on purpose (the zero Config: Redis's).
type Config struct {
	// Epochs: the store makes its epochs from the clock it shares with
	// memstore, so admissions' epochs are compared; and Run's admissions
	// send the epoch last seen and a pause, as the fleet's client does
	// (the PostgreSQL store's fast paths for asks and claims need both;
	// the epoch never changes in Run, so no pause is declared), but with
	// DIFF_NOEPOCH, or DIFF_SHORT without DIFF_EPOCH. With them, a step
	// after which the counts or queues differ is followed by settle.
	Epochs bool
	// Settle: after a limit changes every waiter asks (settle in Run),
	// their replies compared in their status only; otherwise the first
	// waiter without a lease that fits asks, its reply compared in full.
	Settle bool
	// CarryOwnUnits: a carried pair of a lease already admitted carries
	// the lease's own units (on a lease there already with other units,
	// memstore and Redis weigh the pair's, PostgreSQL keeps the lease's
	// own; the contract does not say); otherwise 2.
	CarryOwnUnits bool
	// SkipReleaseAfterLoss: RenewRun sends no release as the first call
	// after a loss of the data. On PostgreSQL a release makes the new
	// epoch too (its marker missing), and the pause an admission declares
	// then counts from the release; memstore and Redis make it at the
	// admission (by design: whichever call comes first).
	SkipReleaseAfterLoss bool
	// TooLate: RenewRun compares the renewals' TooLate too.
	TooLate bool
}

// Pair runs the same driver calls on memstore and on a store, on one
// clock, and compares what they answer.
type Pair struct {
	T   *testing.T
	Now time.Time
	M   *memstore.Store
	R   driver.Store
	// Log is what the run did, logged when it fails.
	Log []string

	side Side
	cfg  Config
	// epoch is the epoch the stores last told (with Config.Epochs, the
	// same on both: each makes it from the clock they share).
	epoch int64
	// loose: admissions' replies are compared in their status only.
	loose bool
}

// New makes a Pair of memstore, its clock at now, and side's store.
func New(t *testing.T, now time.Time, side Side, cfg Config) *Pair {
	p := &Pair{T: t, Now: now, R: side.Store(), side: side, cfg: cfg}
	p.M = memstore.NewWithClock(func() time.Time { return p.Now })
	return p
}

// Seeds runs run as a subtest for each seed DIFF_SEED0 and DIFF_SEEDS
// say (from 0, def of them by default).
func Seeds(t *testing.T, def int, run func(t *testing.T, seed uint64)) {
	from, n := 0, def
	if s := os.Getenv("DIFF_SEEDS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("DIFF_SEED0"); s != "" {
		from, _ = strconv.Atoi(s)
	}
	for seed := from; seed < from+n; seed++ {
		t.Run(strconv.Itoa(seed), func(t *testing.T) { run(t, uint64(seed)) })
	}
}

// Multi reports whether DIFF_MULTI is set.
func Multi() bool { return os.Getenv("DIFF_MULTI") != "" }

// Advance moves both stores' clock by d.
func (p *Pair) Advance(d time.Duration) {
	p.Now = p.Now.Add(d)
	p.side.SetClock(p.Now, d)
	p.Logf("advance %v", d)
}

// Logf notes a line of the run's log.
func (p *Pair) Logf(f string, a ...any) { p.Log = append(p.Log, fmt.Sprintf(f, a...)) }

// Fail logs the end of the run's log and the store's dump, and fails.
func (p *Pair) Fail(f string, a ...any) {
	p.T.Helper()
	start := max(0, len(p.Log)-400)
	for _, l := range p.Log[start:] {
		p.T.Log(l)
	}
	p.side.Dump()
	p.T.Fatalf(f, a...)
}

func (p *Pair) admit(c driver.AdmitCall) driver.AdmitResult {
	p.T.Helper()
	ctx := context.Background()
	c2 := c
	name := p.side.Name()
	rm, err := p.M.AdmitOne(ctx, &c)
	if err != nil {
		p.Fail("mem: %v", err)
	}
	rr, err := p.R.AdmitOne(ctx, &c2)
	if err != nil {
		p.Fail("%s: %v", name, err)
	}
	p.Logf("admit %s keys=%v lim=%v u=%d wait=%v cls=%d flow=%s proc=%s carried=%v -> mem %v/%d/%d/%d %s %v/%d/%d/%d", c.Lease[28:], c.Keys, c.Limits, c.Units, c.Wait, c.Class, c.Flow, c.Proc, c.Carried,
		rm.Status, rm.Key, rm.Count, rm.Queue, name, rr.Status, rr.Key, rr.Count, rr.Queue)
	if tr, ok := p.side.(Tracer); ok && os.Getenv("DIFF_TRACE") != "" {
		tr.Trace(p)
	}
	if rm.Status == driver.StatusAdmitted && fmt.Sprint(rm.Counts) != fmt.Sprint(rr.Counts) {
		p.Fail("admit %s counts: mem %v, %s %v", c.Lease, rm.Counts, name, rr.Counts)
	}
	if p.cfg.Epochs {
		if rm.Epoch != rr.Epoch {
			p.Fail("admit %s epochs: mem %d, %s %d", c.Lease, rm.Epoch, name, rr.Epoch)
		}
		if rm.Epoch != 0 {
			p.epoch = rm.Epoch
		}
	}
	if rm.Status != rr.Status {
		p.Fail("admit %s: mem %+v, %s %+v", c.Lease, rm, name, rr)
	}
	if os.Getenv("DIFF_KEYS") != "" && !p.loose && (rm.Key != rr.Key || rm.Count != rr.Count) {
		// A waiter's ask that the store answered on its fast path (with
		// the epoch: PostgreSQL) served nothing where memstore's served:
		// the counts differ after it, and the reply's too (by design, see
		// settle in Run).
		if c.Epoch == 0 || rm.Status != driver.StatusQueued || p.differs("a")+p.differs("b") == "" {
			p.Fail("admit %s: mem %+v, %s %+v", c.Lease, rm, name, rr)
		}
		p.Logf("  (served on memstore only: the counts differ until a waiter with room asks)")
	}
	return rm
}

func (p *Pair) release(c driver.ReleaseCall) {
	p.T.Helper()
	ctx := context.Background()
	if err := p.M.Release(ctx, &c); err != nil {
		p.Fail("mem: %v", err)
	}
	if err := p.R.Release(ctx, &c); err != nil {
		p.Fail("%s: %v", p.side.Name(), err)
	}
	p.Logf("release %+v", c.Pairs)
}

func (p *Pair) abandon(c driver.AbandonCall) {
	p.T.Helper()
	ctx := context.Background()
	if _, err := p.M.Abandon(ctx, []*driver.AbandonCall{&c}); err != nil {
		p.Fail("mem: %v", err)
	}
	errs, err := p.R.Abandon(ctx, []*driver.AbandonCall{&c})
	if err != nil || errs[0] != nil {
		p.Fail("%s: %v %v", p.side.Name(), err, errs)
	}
	p.Logf("abandon %s %v %v", c.Lease[28:], c.Keys, c.Limits)
}

// count fails the run if the stores' counts of k, or its queues, differ.
func (p *Pair) count(k string) {
	p.T.Helper()
	if d := p.differs(k); d != "" {
		p.Fail("%s", d)
	}
}

// differs tells how the stores' counts of k, and its queues (but with
// DIFF_SHORT), differ ("": they do not).
func (p *Pair) differs(k string) string {
	p.T.Helper()
	ctx := context.Background()
	name := p.side.Name()
	a, err := p.M.Count(ctx, k)
	if err != nil {
		p.Fail("mem: %v", err)
	}
	b, err := p.R.Count(ctx, k)
	if err != nil {
		p.Fail("%s: %v", name, err)
	}
	if a != b {
		return fmt.Sprintf("count %s: mem %d, %s %d", k, a, name, b)
	}
	if os.Getenv("DIFF_SHORT") == "" {
		if qm, qr := p.M.Queued(k), p.side.Queued(k); qm != qr {
			return fmt.Sprintf("queued on %s: mem %d, %s %d", k, qm, name, qr)
		}
	}
	return ""
}

type ticket struct {
	id    string
	keys  []string
	units int
	class uint8
	flow  string
	proc  string
	held  bool
}

// Run drives both stores with the same random calls on one or two keys
// (two with multi), small queues, waiters of one process that never dies
// (of three that die, with DIFF_SHORT).
func Run(p *Pair, seed uint64, multi bool) {
	rng := rand.New(rand.NewPCG(seed, 7))
	limits := map[string]int{"a": 4, "b": 3}
	ttl, claim, live := time.Hour, time.Minute, 10*time.Hour
	short := os.Getenv("DIFF_SHORT") != ""
	var pause time.Duration // see Config.Epochs
	if p.cfg.Epochs && os.Getenv("DIFF_NOEPOCH") == "" && (!short || os.Getenv("DIFF_EPOCH") != "") {
		pause = ttl
	}
	if short { // grants that lapse, processes that die
		claim, live = 10*time.Millisecond, 30*time.Millisecond
	}
	var tickets []*ticket
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
	call := func(tk *ticket, wait bool) driver.AdmitCall {
		return driver.AdmitCall{Lease: tk.id, Keys: tk.keys, Limits: lims(tk.keys), Units: tk.units, TTL: ttl, Claim: claim,
			Live: live, Starts: os.Getenv("DIFF_STARTS") != "", Wait: wait, Epoch: known(), Pause: pause, Class: tk.class, Flow: tk.flow, Weight: 1, Proc: tk.proc, MaxQueue: -1, MaxFlowQueue: -1}
	}
	over := func(tk *ticket) bool {
		for _, l := range lims(tk.keys) {
			if l > 0 && tk.units > l {
				return true
			}
		}
		return false
	}
	drop := func(tk *ticket) {
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
		p.Logf("settle")
		p.loose = true
		defer func() { p.loose = false }()
		for _, tk := range slices.Clone(tickets) {
			if tk.held || p.side.Leased(tk.keys[0], tk.id) || over(tk) {
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
			tk := &ticket{id: fmt.Sprintf("%032x", n), keys: keys, units: 1 + rng.IntN(3), class: uint8(rng.IntN(2)), flow: "f" + strconv.Itoa(rng.IntN(2)), proc: "proc"}
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
				d := &ticket{id: fmt.Sprintf("%032x", n), keys: []string{"a"}, units: 1 + rng.IntN(3), held: true, proc: tk.proc}
				c.Carried = []driver.Pair{{Key: "a", Lease: d.id, Units: d.units}}
				if other := fmt.Sprintf("%032x", 1+rng.IntN(n)); rng.IntN(3) == 0 && other != c.Lease && other != d.id {
					u := 2
					if p.cfg.CarryOwnUnits { // see Config.CarryOwnUnits
						u = units[other]
					}
					c.Carried = append(c.Carried, driver.Pair{Key: "a", Lease: other, Units: u})
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
			p.Logf("limit %s = %d", k, limits[k])
			// A claim may skip serving (driver.AdmitCall step 5): waiters
			// ask, and serve the room a raised limit makes (see
			// Config.Settle).
			if p.cfg.Settle {
				settle()
				break
			}
			for _, tk := range tickets {
				if !tk.held && !p.side.Leased(tk.keys[0], tk.id) && !over(tk) {
					if r := p.admit(call(tk, true)); r.Status == driver.StatusAdmitted {
						tk.held = true
					}
					break
				}
			}
		default:
			p.Advance(time.Duration(1+rng.IntN(5)) * time.Millisecond)
		}
		if pause != 0 && p.differs("a")+p.differs("b") != "" {
			settle()
		}
		p.count("a")
		p.count("b")
		if c, ok := p.side.(Checker); ok {
			c.Check(p, "a")
			c.Check(p, "b")
		}
	}
}
