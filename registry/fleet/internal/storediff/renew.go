package storediff

// The renewal and budget runs: RenewRun, BudgetRun.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// lease is a lease of RenewRun, with what each store last told of it.
type lease struct {
	id       string
	keys     []string
	units    int
	em, er   int64 // the epoch each store last told it in
	released bool
}

// renewTTL is the TTL of every lease of RenewRun: short enough that the
// Redis store notes every call heard.
const renewTTL = 15 * time.Millisecond

// lims gives key b a limit one over a's.
func lims(keys []string, limit int) []int {
	out := []int{limit}
	if len(keys) > 1 {
		out = append(out, limit+1)
	}
	return out
}

// RenewRun drives one key (two for some leases) with admissions,
// renewals (of held and of released leases), expiries and losses of the
// store's data.
func RenewRun(p *Pair, seed uint64) {
	t := p.T
	ctx := context.Background()
	name := p.side.Name()
	rng := rand.New(rand.NewPCG(seed, 11))
	limit := 4
	var em, er int64 // the epochs the caller last saw
	var leases []*lease
	lost := false // the stores lost their data, and no admission or renewal came since
	n := 0
	const pause = 20 * time.Millisecond
	for step := 0; step < 120; step++ {
		switch op := rng.IntN(12); {
		case op < 4:
			n++
			l := &lease{id: fmt.Sprintf("%032x", n), units: min(1+rng.IntN(3), max(limit, 1)), keys: []string{"a"}}
			if rng.IntN(3) == 0 {
				l.keys = []string{"a", "b"}
			}
			c := driver.AdmitCall{Lease: l.id, Keys: l.keys, Limits: lims(l.keys, limit), Units: l.units, TTL: renewTTL, Claim: time.Minute,
				Live: time.Hour, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1, Pause: pause}
			cm, cr := c, c
			cm.Epoch, cr.Epoch = em, er
			rm, err := p.M.AdmitOne(ctx, &cm)
			require.NoError(t, err)
			rr, err := p.R.AdmitOne(ctx, &cr)
			require.NoError(t, err)
			p.Logf("admit %s keys=%v u=%d lim=%d epoch=%d/%d -> mem %v/%d/%d %s %v/%d/%d", l.id[30:], l.keys, l.units, limit, em, er, rm.Status, rm.Count, rm.Epoch, name, rr.Status, rr.Count, rr.Epoch)
			if rm.Status != rr.Status {
				p.Fail("admit: mem %+v %s %+v", rm, name, rr)
			}
			em, er, lost = rm.Epoch, rr.Epoch, false
			if rm.Status == driver.StatusAdmitted {
				l.em, l.er = rm.Epoch, rr.Epoch
				leases = append(leases, l)
			}
		case op < 7 && len(leases) > 0:
			var ls []*lease
			for _, l := range leases {
				if rng.IntN(2) == 0 {
					ls = append(ls, l)
				}
			}
			mk := func(known func(*lease) int64, ep int64) *driver.RenewCall {
				c := &driver.RenewCall{TTL: renewTTL, Epoch: ep, Pause: pause}
				for _, l := range ls {
					c.Leases = append(c.Leases, driver.Renewal{Lease: l.id, Units: l.units, Mode: driver.ModeReassert, Epoch: known(l),
						Keys: l.keys, Limits: lims(l.keys, limit)})
				}
				return c
			}
			rm, err := p.M.Renew(ctx, mk(func(l *lease) int64 { return l.em }, em))
			require.NoError(t, err)
			rr, err := p.R.Renew(ctx, mk(func(l *lease) int64 { return l.er }, er))
			require.NoError(t, err)
			var ids []string
			for _, l := range ls {
				ids = append(ids, fmt.Sprintf("%s(r=%v)", l.id[30:], l.released))
			}
			p.Logf("renew %v lim=%d -> mem %v %s %v", ids, limit, rm.Leases, name, rr.Leases)
			if fmt.Sprint(rm.Leases) != fmt.Sprint(rr.Leases) || p.cfg.TooLate && rm.TooLate != rr.TooLate {
				p.Fail("renew: mem %+v %s %+v", rm, name, rr)
			}
			em, er, lost = rm.Epoch, rr.Epoch, false
			for i, l := range ls {
				if rm.Leases[i] != driver.FateGone {
					l.em, l.er = rm.Epoch, rr.Epoch
				}
			}
		case op < 9 && len(leases) > 0:
			l := leases[rng.IntN(len(leases))]
			if lost && p.cfg.SkipReleaseAfterLoss { // see Config.SkipReleaseAfterLoss
				p.Logf("release of %s skipped", l.id[30:])
				continue
			}
			var pairs []driver.Release
			for _, k := range l.keys {
				pairs = append(pairs, driver.Release{Key: k, Lease: l.id, Limit: limit})
			}
			p.release(driver.ReleaseCall{TTL: renewTTL, Claim: time.Minute, Pairs: pairs})
			l.released = true
		case op == 9:
			limit = 1 + rng.IntN(6)
			p.Logf("limit %d", limit)
		case op == 10 && rng.IntN(4) == 0:
			p.M.Lose()
			p.side.Lose()
			p.Logf("lose")
			lost = true
			p.Advance(time.Millisecond) // a new epoch is another µs
		default:
			p.Advance(time.Duration(1+rng.IntN(12)) * time.Millisecond)
		}
		p.count("a")
		p.count("b")
	}
}

// BudgetRun drives one budget with charges, corrections, moves and checks
// on both stores.
func BudgetRun(p *Pair, seed uint64) {
	t := p.T
	ctx := context.Background()
	name := p.side.Name()
	rng := rand.New(rand.NewPCG(seed, 3))
	var steps []int64
	for i := 0; i < 150; i++ {
		c := driver.BudgetCall{Key: "b", Limits: [3]int64{int64(rng.IntN(40)), int64(rng.IntN(30)), int64(rng.IntN(30))}}
		for j := range c.Cost {
			c.Cost[j] = int64(rng.IntN(12))
		}
		switch rng.IntN(6) {
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
		case 4:
			c.Check = true
		default:
			p.Advance(time.Duration(rng.IntN(30000)) * time.Millisecond)
			continue
		}
		rm, err := p.M.Budget(ctx, &c)
		require.NoError(t, err)
		rr, err := p.R.Budget(ctx, &c)
		require.NoError(t, err)
		p.Logf("budget %+v -> mem %+v %s %+v", c, rm, name, rr)
		if rm != rr {
			p.Fail("budget: mem %+v %s %+v", rm, name, rr)
		}
		if rm.Charged && !c.Correct {
			steps = append(steps, rm.Step)
		}
	}
}
