package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// Queue keys under a mix of callers: waiters of two processes with
// different TTLs (and of a third that dies and never asks again) on one
// or two keys, of 1 or 2 units, three classes and three flows, admitted,
// released, withdrawn, asking again every third of a claim window, on a
// miniredis whose clock and key expiries move on. After each step no key
// of a queue lives without an expiry, each expires no sooner than the end
// of the last cover (c) while that is ahead, and no waiter that keeps
// asking is lost from its queue; once every caller is gone, every queue
// key expires.
type stressProc struct {
	name             string
	ttl, claim, live int
	dies             bool
}

type stressTicket struct {
	id       string
	proc     *stressProc
	keys     []string
	units    int
	rank     int
	flow     string
	lastAsk  int64
	queued   bool
	held     bool
	weight   int
	silenced bool
}

var stressKeys = []string{"q{n}:a", "q{n}:b"}
var stressLimits = map[string]int{"q{n}:a": 3, "q{n}:b": 2}
var queueSuffixes = []string{"#q", "#t", "#v", "#u", "#m", "#f0", "#f1", "#f2"}

func TestQueueKeysExpireUnderStress(t *testing.T) {
	if testing.Short() {
		t.Skip("three runs of 400 steps")
	}
	for seed := range 3 {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { queueKeysUnderStress(t, uint64(seed)) })
	}
}

func queueKeysUnderStress(t *testing.T, seed uint64) {
	m := redistest.StartMini(t)
	rdb := m.Client()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	procs := []*stressProc{
		{name: "p1", ttl: 3000, claim: 200, live: 1000},
		{name: "p2", ttl: 600, claim: 200, live: 600},
		{name: "p3", ttl: 3000, claim: 200, live: 1000, dies: true},
	}
	nowMS := func() int64 { return m.Now.UnixMilli() }
	advance := func(d time.Duration) {
		m.Advance(d)
		m.Srv.FastForward(d)
	}
	var tickets []*stressTicket
	admit := func(tk *stressTicket) int64 {
		keys := append([]string{"q{n}#epoch", "q{n}#pause", "q{n}:abandoned:" + tk.id, qProcs}, tk.keys...)
		args := []any{tk.id, tk.proc.ttl, len(tk.keys), 0, 0, 0, 1, tk.proc.claim, tk.rank, tk.flow, tk.weight,
			tk.proc.name, qWake, -1, -1, tk.proc.live, tk.units}
		for _, k := range tk.keys {
			args = append(args, stressLimits[k])
		}
		res, err := acquireScript.Run(ctx, rdb, append(keys, qHeard), args...).Int64Slice()
		require.NoError(t, err)
		tk.lastAsk = nowMS()
		switch res[0] {
		case acquireAdmitted:
			tk.queued, tk.held = false, true
		case acquireQueued:
			tk.queued = true
		default:
			t.Fatalf("status %d", res[0])
		}
		return res[0]
	}
	release := func(tk *stressTicket) {
		args := []any{tk.proc.claim, qWake}
		for _, k := range tk.keys {
			args = append(args, tk.id, stressLimits[k])
		}
		keys := append([]string{"q{n}#pause", qProcs}, tk.keys...)
		require.NoError(t, releaseScript.Run(ctx, rdb, append(keys, qHeard), append(args, tk.proc.ttl, 0)...).Err())
		tk.held = false
	}
	withdraw := func(tk *stressTicket) {
		keys := append([]string{"q{n}#pause", qProcs}, tk.keys...)
		keys = append(keys, "q{n}:abandoned:"+tk.id, qHeard)
		args := []any{tk.id, tk.proc.ttl, 0, tk.proc.claim, qWake, 0}
		for _, k := range tk.keys {
			args = append(args, stressLimits[k])
		}
		require.NoError(t, abandonScript.Run(ctx, rdb, keys, args...).Err())
		tk.queued, tk.held = false, false
	}
	check := func(step string) {
		t.Helper()
		now := nowMS()
		for _, k := range stressKeys {
			c, cerr := rdb.HGet(ctx, k+"#v", "c").Float64()
			for _, s := range queueSuffixes {
				ms, err := rdb.PTTL(ctx, k+s).Result()
				require.NoError(t, err)
				require.NotEqual(t, time.Duration(-1), ms, "%s: %s%s has no expiry", step, k, s)
				if ms >= 0 && cerr == nil && int64(c) > now {
					require.GreaterOrEqual(t, ms.Milliseconds(), int64(c)-now-1, "%s: %s%s expires before c", step, k, s)
				}
			}
		}
		// No live waiter's queue lost: a ticket that asked within its TTL
		// and believes it is queued is still in each key's #t, or granted.
		for _, tk := range tickets {
			if !tk.queued || tk.silenced {
				continue
			}
			for _, k := range tk.keys {
				in, err := rdb.HExists(ctx, k+"#t", tk.id).Result()
				require.NoError(t, err)
				if in {
					continue
				}
				_, err = rdb.ZScore(ctx, k, tk.id).Result()
				if err == redis.Nil {
					t.Fatalf("%s: live waiter %s (%s) lost from %s's queue (asked %d ms ago)", step, tk.id, tk.proc.name, k, now-tk.lastAsk)
				}
			}
		}
	}
	n := 0
	for step := range 400 {
		name := ""
		switch r := rng.IntN(10); {
		case r < 4: // a newcomer
			n++
			p := procs[rng.IntN(len(procs))]
			ks := []string{stressKeys[rng.IntN(2)]}
			if rng.IntN(3) == 0 {
				ks = stressKeys
			}
			tk := &stressTicket{id: fmt.Sprint("t", n), proc: p, keys: ks, units: 1 + rng.IntN(2), rank: rng.IntN(3),
				flow: fmt.Sprint("f", rng.IntN(3)), weight: 1 + rng.IntN(2)}
			if p.dies {
				tk.silenced = true // it never asks again
			}
			tickets = append(tickets, tk)
			admit(tk)
			name = "admit " + tk.id
		case r < 6: // a holder releases
			for _, tk := range tickets {
				if tk.held && rng.IntN(2) == 0 {
					release(tk)
					name = "release " + tk.id
					break
				}
			}
		case r < 7: // a waiter gives up
			for _, tk := range tickets {
				if tk.queued && !tk.silenced && rng.IntN(3) == 0 {
					withdraw(tk)
					name = "withdraw " + tk.id
					break
				}
			}
		default:
			d := time.Duration(1+rng.IntN(60)) * time.Millisecond
			advance(d)
			name = "advance"
		}
		check(fmt.Sprint(step, " ", name))
		// Waiters ask again within a claim window (a third of it here), and
		// claim their grants.
		for _, tk := range tickets {
			if tk.queued && !tk.silenced && nowMS()-tk.lastAsk >= int64(tk.proc.claim/3) {
				admit(tk)
				check(fmt.Sprint(step, " ask ", tk.id))
			}
		}
	}
	// Everyone goes away without a word: every queue key expires.
	for range 100 {
		advance(time.Second)
	}
	for _, k := range stressKeys {
		for _, s := range queueSuffixes {
			ex, err := rdb.Exists(ctx, k+s).Result()
			require.NoError(t, err)
			require.Zero(t, ex, "%s%s left behind", k, s)
		}
	}
}
