package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// A differential check of the Redis store against memstore, the contract
// written out in Go: the same random driver calls on both, on one fake
// clock (a miniredis), their answers compared. Knobs (environment):
// DIFF_SEEDS (how many runs), DIFF_MULTI (tickets of two keys: memstore
// keeps no urgent places and may serve a claim where Redis may skip it, so
// some runs differ by design), DIFF_LIGHTMULTI (those of one unit),
// DIFF_SHORT (claim windows that lapse, processes that die), DIFF_STARTS
// (compare the counts of learned keys), DIFF_KEYS (compare the key named
// and its count too), DIFF_TRACE (log the queue), DIFF_REAL (a real
// redis-server, on its own clock). After each call the Redis store's
// summaries of its queues are checked against walks of them.

// diffPair runs the same driver calls on memstore and on the Redis store
// (a miniredis on the same fake clock) and compares what they answer.
type diffPair struct {
	t    *testing.T
	mini *redistest.Mini
	now  time.Time
	m, r driver.Store
	log  []string
	// real is the redis-server the Redis store runs on with DIFF_REAL
	// (nil: the miniredis); zmembers and exists read whichever it is.
	real *redis.Client
}

func (p *diffPair) zmembers(k string) []string {
	if p.real != nil {
		m, _ := p.real.ZRange(context.Background(), k, 0, -1).Result()
		return m
	}
	m, _ := p.mini.Srv.ZMembers(k)
	return m
}

func (p *diffPair) exists(k string) bool {
	if p.real != nil {
		return p.real.Exists(context.Background(), k).Val() == 1
	}
	return p.mini.Srv.Exists(k)
}

func newDiffPair(t *testing.T) *diffPair {
	mini := redistest.StartMini(t)
	p := &diffPair{t: t, mini: mini, now: mini.Now}
	p.m = memstore.NewWithClock(func() time.Time { return p.now })

	p.r = redisstore.New(mini.Client(), "h")
	if os.Getenv("DIFF_REAL") != "" {
		p.real = redistest.Start(t).Client()
		p.r = redisstore.New(p.real, "h")
	}
	return p
}

func (p *diffPair) advance(d time.Duration) {
	p.now = p.now.Add(d)
	p.mini.Advance(d)
	p.mini.Srv.FastForward(d)
	p.logf("advance %v", d)
}

func (p *diffPair) logf(f string, a ...any) { p.log = append(p.log, fmt.Sprintf(f, a...)) }

func (p *diffPair) fail(f string, a ...any) {
	p.t.Helper()
	start := max(0, len(p.log)-400)
	for _, l := range p.log[start:] {
		p.t.Log(l)
	}
	p.dump()
	p.t.Fatalf(f, a...)
}

func (p *diffPair) dump() {
	for _, k := range []string{"a", "b"} {
		base := "inflight:{h}:" + k
		q := p.zmembers(base + "#q")
		p.t.Logf("redis %s queue: %v", k, q)
		if p.mini.Srv.Exists(base + "#t") {
			f, _ := p.mini.Srv.HKeys(base + "#t")
			for _, x := range f {
				if strings.HasPrefix(x, "u|") || strings.HasPrefix(x, "w|") || strings.HasPrefix(x, "p|") {
					p.t.Logf("  %s = %s", x, p.mini.Srv.HGet(base+"#t", x))
				}
			}
		}
		p.t.Logf("redis %s leases: %v", k, p.zmembers(base))
	}
}

func (p *diffPair) admit(c driver.AdmitCall) driver.AdmitResult {
	p.t.Helper()
	ctx := context.Background()
	c2 := c
	rm, err := p.m.AdmitOne(ctx, &c)
	if err != nil {
		p.fail("mem: %v", err)
	}
	rr, err := p.r.AdmitOne(ctx, &c2)
	if err != nil {
		p.fail("redis: %v", err)
	}
	p.logf("admit %s keys=%v lim=%v u=%d wait=%v cls=%d flow=%s -> mem %v/%d/%d/%d redis %v/%d/%d/%d", c.Lease, c.Keys, c.Limits, c.Units, c.Wait, c.Class, c.Flow,
		rm.Status, rm.Key, rm.Count, rm.Queue, rr.Status, rr.Key, rr.Count, rr.Queue)
	if os.Getenv("DIFF_TRACE") != "" {
		q, _ := p.mini.Srv.ZMembers("inflight:{h}:a#q")
		var us []string
		for _, m := range q {
			id := m[len(m)-2:]
			u := ""
			if p.mini.Srv.Exists("inflight:{h}:a#t") {
				u = p.mini.Srv.HGet("inflight:{h}:a#t", "u|"+m[len(m)-32:])
			}
			us = append(us, m[:1]+":"+id+"("+u+")")
		}
		l, _ := p.mini.Srv.ZMembers("inflight:{h}:a")
		for i := range l {
			l[i] = l[i][30:]
		}
		p.logf("   redis q %v leases %v", us, l)
	}
	if rm.Status == driver.StatusAdmitted && fmt.Sprint(rm.Counts) != fmt.Sprint(rr.Counts) {
		p.fail("admit %s counts: mem %v, redis %v", c.Lease, rm.Counts, rr.Counts)
	}
	if rm.Status != rr.Status || (os.Getenv("DIFF_KEYS") != "" && (rm.Key != rr.Key || rm.Count != rr.Count)) {
		p.fail("admit %s: mem %+v, redis %+v", c.Lease, rm, rr)
	}
	return rm
}

func (p *diffPair) release(c driver.ReleaseCall) {
	p.t.Helper()
	ctx := context.Background()
	if err := p.m.Release(ctx, &c); err != nil {
		p.fail("mem: %v", err)
	}
	if err := p.r.Release(ctx, &c); err != nil {
		p.fail("redis: %v", err)
	}
	p.logf("release %+v", c.Pairs)
}

func (p *diffPair) abandon(c driver.AbandonCall) {
	p.t.Helper()
	ctx := context.Background()
	if _, err := p.m.Abandon(ctx, []*driver.AbandonCall{&c}); err != nil {
		p.fail("mem: %v", err)
	}
	errs, err := p.r.Abandon(ctx, []*driver.AbandonCall{&c})
	if err != nil || errs[0] != nil {
		p.fail("redis: %v %v", err, errs)
	}
	p.logf("abandon %s %v %v", c.Lease, c.Keys, c.Limits)
}

func (p *diffPair) renew(c driver.RenewCall) []driver.Fate {
	p.t.Helper()
	ctx := context.Background()
	rm, err := p.m.Renew(ctx, &c)
	if err != nil {
		p.fail("mem: %v", err)
	}
	rr, err := p.r.Renew(ctx, &c)
	if err != nil {
		p.fail("redis: %v", err)
	}
	p.logf("renew %+v -> mem %v redis %v", c.Leases, rm.Leases, rr.Leases)
	if fmt.Sprint(rm.Leases) != fmt.Sprint(rr.Leases) || rm.TooLate != rr.TooLate {
		p.fail("renew: mem %+v, redis %+v", rm, rr)
	}
	return rm.Leases
}

func (p *diffPair) count(k string) int {
	p.t.Helper()
	ctx := context.Background()
	a, err := p.m.Count(ctx, k)
	if err != nil {
		p.fail("mem: %v", err)
	}
	b, err := p.r.Count(ctx, k)
	if err != nil {
		p.fail("redis: %v", err)
	}
	p.logf("count %s -> mem %d redis %d", k, a, b)
	if a != b {
		p.fail("count %s: mem %d, redis %d", k, a, b)
	}
	qm := p.m.(*memstore.Store).Queued(k)
	qr := p.zmembers("inflight:{h}:" + k + "#q")
	if os.Getenv("DIFF_SHORT") != "" {
		qm = len(qr) // dead tickets behind a heavy head wait in Redis (documented)
	}
	if p.exists("inflight:{h}:"+k+"#q") && qm != len(qr) || !p.exists("inflight:{h}:"+k+"#q") && qm != 0 {
		p.fail("queued on %s: mem %d, redis %d", k, qm, len(qr))
	}

	return a
}

// TestDifferential drives both stores with the same random calls on
// one or two keys, small queues, waiters of one process that never dies.
func TestDifferential(t *testing.T) {
	seeds := 10
	if s := os.Getenv("DIFF_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	multi := os.Getenv("DIFF_MULTI") != ""
	for seed := range seeds {
		t.Run(strconv.Itoa(seed), func(t *testing.T) { diffRun(t, uint64(seed), multi) })
	}
}

type diffTicket struct {
	id    string
	keys  []string
	units int
	class uint8
	flow  string
	proc  string
	held  bool
}

func diffRun(t *testing.T, seed uint64, multi bool) {
	p := newDiffPair(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	limits := map[string]int{"a": 4, "b": 3}
	ttl, claim, live := time.Hour, time.Minute, 10*time.Hour
	short := os.Getenv("DIFF_SHORT") != ""
	if short { // grants that lapse, processes that die
		claim, live = 10*time.Millisecond, 30*time.Millisecond
	}
	var tickets []*diffTicket
	n := 0
	lims := func(keys []string) []int {
		out := make([]int, len(keys))
		for i, k := range keys {
			out[i] = limits[k]
		}
		return out
	}
	call := func(tk *diffTicket, wait bool) driver.AdmitCall {
		return driver.AdmitCall{Lease: tk.id, Keys: tk.keys, Limits: lims(tk.keys), Units: tk.units, TTL: ttl, Claim: claim,
			Live: live, Starts: os.Getenv("DIFF_STARTS") != "", Wait: wait, Class: tk.class, Flow: tk.flow, Weight: 1, Proc: tk.proc, MaxQueue: -1, MaxFlowQueue: -1}
	}
	over := func(tk *diffTicket) bool {
		for _, l := range lims(tk.keys) {
			if l > 0 && tk.units > l {
				return true
			}
		}
		return false
	}
	for step := 0; step < 150; step++ {
		switch op := rng.IntN(10); {
		case op < 3 && len(tickets) < 30: // a newcomer
			n++
			keys := []string{"a"}
			if multi && rng.IntN(4) == 0 {
				keys = []string{"a", "b"}
			}
			tk := &diffTicket{id: fmt.Sprintf("%032x", n), keys: keys, units: 1 + rng.IntN(3), class: uint8(rng.IntN(2)), flow: "f" + strconv.Itoa(rng.IntN(2)), proc: "proc"}
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
				d := &diffTicket{id: fmt.Sprintf("%032x", n), keys: []string{"a"}, units: 1 + rng.IntN(3), held: true, proc: tk.proc}
				c.Carried = []driver.Pair{{Key: "a", Lease: d.id, Units: d.units}}
				if other := fmt.Sprintf("%032x", 1+rng.IntN(n)); rng.IntN(3) == 0 && other != c.Lease && other != d.id {
					c.Carried = append(c.Carried, driver.Pair{Key: "a", Lease: other, Units: 2})
				}
				tickets = append(tickets, d)
			}
			r := p.admit(c)
			switch r.Status {
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
				tickets = diffDrop(tickets, tk)
				continue
			}
			r := p.admit(call(tk, true))
			switch r.Status {
			case driver.StatusAdmitted:
				tk.held = true
			case driver.StatusQueued:
			default:
				tickets = diffDrop(tickets, tk)
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
				tickets = diffDrop(tickets, o)
			}
			p.release(driver.ReleaseCall{TTL: ttl, Claim: claim, Pairs: pairs})
			tickets = diffDrop(tickets, tk)
		case op == 7 && len(tickets) > 0: // a waiter gives up
			tk := tickets[rng.IntN(len(tickets))]
			if tk.held {
				continue
			}
			p.abandon(driver.AbandonCall{Lease: tk.id, Keys: tk.keys, Limits: lims(tk.keys), TTL: ttl, Claim: claim})
			tickets = diffDrop(tickets, tk)
		case op == 8: // a limit changes
			k := []string{"a", "b"}[rng.IntN(2)]
			limits[k] = rng.IntN(7)
			p.logf("limit %s = %d", k, limits[k])
			// A claim on Redis may skip serving (driver.AdmitCall step 5):
			// let a waiter's ask serve the room a raised limit makes.
			for _, tk := range tickets {
				if l := p.zmembers("inflight:{h}:" + tk.keys[0]); !tk.held && !slices.Contains(l, tk.id) && !over(tk) {
					if r := p.admit(call(tk, true)); r.Status == driver.StatusAdmitted {
						tk.held = true
					}
					break
				}
			}
		default:
			p.advance(time.Duration(1+rng.IntN(5)) * time.Millisecond)
		}
		p.count("a")
		p.count("b")
		p.summary("a")
		p.summary("b")
	}
}

// summary fails the run if the summary of key's queue on the Redis store
// (see clearBehind in queue.go) is not what a walk of the queue finds
// (the miniredis only).
func (p *diffPair) summary(key string) {
	if p.real != nil {
		return
	}
	srv, k := p.mini.Srv, "inflight:{h}:"+key
	q, _ := srv.ZMembers(k + "#q")
	if len(q) == 0 {
		return
	}
	marked := 0
	for _, m := range q {
		id := m[strings.LastIndex(m, "|")+1:]
		if strings.Contains(srv.HGet(k+"#t", "k|"+id), "],[") || srv.HGet(k+"#t", "u|"+id) != "" {
			marked++
		}
	}
	fields, _ := srv.HKeys(k + "#t")
	want := fmt.Sprint("1 ", marked, " ", len(fields)+len(q)<<24, " ", srv.HGet(k+"#v", "seq"))
	got := fmt.Sprint(srv.HGet(k+"#v", "xi"), " ", srv.HGet(k+"#v", "x"), " ", srv.HGet(k+"#v", "xe"), " ", srv.HGet(k+"#v", "xs"))
	if got != want {
		p.fail("the summary of %s's queue (xi x xe xs) is %s, its walk %s", key, got, want)
	}
}

func diffDrop(ts []*diffTicket, tk *diffTicket) []*diffTicket {
	for i, x := range ts {
		if x == tk {
			return append(ts[:i], ts[i+1:]...)
		}
	}
	return ts
}

// TestDifferentialRenew drives one key with admissions of short and
// long TTLs, renewals (of held and of released leases), expiries and
// losses of the store's data.
func TestDifferentialRenew(t *testing.T) {
	seeds := 10
	if s := os.Getenv("DIFF_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	for seed := range seeds {
		t.Run(strconv.Itoa(seed), func(t *testing.T) { diffRenewRun(t, uint64(seed)) })
	}
}

type diffLease struct {
	id       string
	keys     []string
	units    int
	em, er   int64 // the epoch each store last told it in
	released bool
}

const diffTTL = 15 * time.Millisecond

func diffRenewRun(t *testing.T, seed uint64) {
	p := newDiffPair(t)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 11))
	limit := 4
	var em, er int64 // the epochs the caller last saw
	var leases []*diffLease
	n := 0
	const pause = 20 * time.Millisecond
	for step := 0; step < 120; step++ {
		switch op := rng.IntN(12); {
		case op < 4:
			n++
			l := &diffLease{id: fmt.Sprintf("%032x", n), units: min(1+rng.IntN(3), max(limit, 1)), keys: []string{"a"}}
			if rng.IntN(3) == 0 {
				l.keys = []string{"a", "b"}
			}
			ttl := diffTTL // one TTL for all: short enough that the Redis store notes every call heard
			c := driver.AdmitCall{Lease: l.id, Keys: l.keys, Limits: diffLims(l.keys, limit), Units: l.units, TTL: ttl, Claim: time.Minute,
				Live: time.Hour, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1, Pause: pause}
			cm, cr := c, c
			cm.Epoch, cr.Epoch = em, er
			rm, err := p.m.AdmitOne(ctx, &cm)
			require.NoError(t, err)
			rr, err := p.r.AdmitOne(ctx, &cr)
			require.NoError(t, err)
			p.logf("admit %s u=%d ttl=%v lim=%d -> mem %v/%d redis %v/%d", l.id[30:], l.units, ttl, limit, rm.Status, rm.Count, rr.Status, rr.Count)
			if rm.Status != rr.Status {
				p.fail("admit: mem %+v redis %+v", rm, rr)
			}
			em, er = rm.Epoch, rr.Epoch
			if rm.Status == driver.StatusAdmitted {
				l.em, l.er = rm.Epoch, rr.Epoch
				leases = append(leases, l)
			}
		case op < 7 && len(leases) > 0:
			var ls []*diffLease
			for _, l := range leases {
				if rng.IntN(2) == 0 {
					ls = append(ls, l)
				}
			}
			mk := func(known, last func(*diffLease) int64, ep int64) *driver.RenewCall {
				c := &driver.RenewCall{TTL: diffTTL, Epoch: ep, Pause: pause}
				for _, l := range ls {
					c.Leases = append(c.Leases, driver.Renewal{Lease: l.id, Units: l.units, Mode: driver.ModeReassert, Epoch: known(l),
						Keys: l.keys, Limits: diffLims(l.keys, limit)})
				}
				return c
			}
			rm, err := p.m.Renew(ctx, mk(func(l *diffLease) int64 { return l.em }, nil, em))
			require.NoError(t, err)
			rr, err := p.r.Renew(ctx, mk(func(l *diffLease) int64 { return l.er }, nil, er))
			require.NoError(t, err)
			var ids []string
			for _, l := range ls {
				ids = append(ids, fmt.Sprintf("%s(r=%v)", l.id[30:], l.released))
			}
			p.logf("renew %v -> mem %v redis %v", ids, rm.Leases, rr.Leases)
			if fmt.Sprint(rm.Leases) != fmt.Sprint(rr.Leases) {
				p.fail("renew: mem %+v redis %+v", rm, rr)
			}
			em, er = rm.Epoch, rr.Epoch
			for i, l := range ls {
				if rm.Leases[i] != driver.FateGone {
					l.em, l.er = rm.Epoch, rr.Epoch
				}
			}
		case op < 9 && len(leases) > 0:
			l := leases[rng.IntN(len(leases))]
			var pairs []driver.Release
			for _, k := range l.keys {
				pairs = append(pairs, driver.Release{Key: k, Lease: l.id, Limit: limit})
			}
			p.release(driver.ReleaseCall{TTL: diffTTL, Claim: time.Minute, Pairs: pairs})
			l.released = true
		case op == 9:
			limit = 1 + rng.IntN(6)
			p.logf("limit %d", limit)
		case op == 10 && rng.IntN(4) == 0:
			p.m.(*memstore.Store).Lose()
			p.mini.Srv.FlushAll()
			p.logf("lose")
			p.advance(time.Millisecond) // a new epoch is another µs
		default:
			p.advance(time.Duration(1+rng.IntN(12)) * time.Millisecond)
		}
		p.count("a")
		p.count("b")
	}
}

// TestDifferentialBudget drives one budget with charges, corrections
// and moves on both stores.
func TestDifferentialBudget(t *testing.T) {
	for seed := range 20 {
		t.Run(strconv.Itoa(seed), func(t *testing.T) {
			p := newDiffPair(t)
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
				p.logf("budget %+v -> mem %+v redis %+v", c, rm, rr)
				if rm != rr {
					p.fail("budget: mem %+v redis %+v", rm, rr)
				}
				if rm.Charged && !c.Correct {
					steps = append(steps, rm.Step)
				}
			}
		})
	}
}

// diffLims gives key b a limit one over a's.
func diffLims(keys []string, limit int) []int {
	out := []int{limit}
	if len(keys) > 1 {
		out = append(out, limit+1)
	}
	return out
}
