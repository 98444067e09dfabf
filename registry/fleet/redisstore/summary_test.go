package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// The queue's summary (clearBehind in summary.go): what <k>#v says of the
// queue is checked against a walk of it after every call of a random run
// of the real scripts, and a summary that a script of the release before
// left behind is not trusted.

const qKey2 = "q{n}:k2"

// summaryOf walks key's queue and returns what its summary should say:
// the tickets of several keys or charged (x), the length of the queue's
// hash plus summaryLen times the queue's (xe); and what the summary says,
// with xs and seq. An empty queue has neither (both nil).
func summaryOf(t *testing.T, rig *queueRig, key string) (want, got map[string]string) {
	t.Helper()
	ctx := context.Background()
	q, err := rig.rdb.ZRange(ctx, key+"#q", 0, -1).Result()
	require.NoError(t, err)
	if len(q) == 0 {
		return nil, nil
	}
	marked := 0
	for _, m := range q {
		id := m[strings.LastIndex(m, "|")+1:]
		f, err := rig.rdb.HMGet(ctx, key+"#t", "k|"+id, "u|"+id).Result()
		require.NoError(t, err)
		if k, _ := f[0].(string); strings.Contains(k, "],[") || f[1] != nil {
			marked++
		}
	}
	n, err := rig.rdb.HLen(ctx, key+"#t").Result()
	require.NoError(t, err)
	v, err := rig.rdb.HMGet(ctx, key+"#v", "xi", "x", "xe", "xs", "seq").Result()
	require.NoError(t, err)
	got = map[string]string{}
	for i, f := range []string{"xi", "x", "xe", "xs", "seq"} {
		s, _ := v[i].(string)
		got[f] = s
	}
	want = map[string]string{"xi": "1", "x": strconv.Itoa(marked), "xe": strconv.Itoa(int(n) + len(q)<<24), "xs": got["seq"], "seq": got["seq"]}
	return want, got
}

func requireSummary(t *testing.T, rig *queueRig, step string) {
	t.Helper()
	for _, k := range []string{qKey, qKey2} {
		want, got := summaryOf(t, rig, k)
		require.Equal(t, want, got, "%s: the summary of %s", step, k)
	}
}

// abandonOn takes ticket id back from keys, serving them under limits.
func (rig *queueRig) abandonOn(id string, keys []string, limits []int) {
	rig.t.Helper()
	ks := append(append([]string{"q{n}#pause", qProcs}, keys...), "q{n}:abandoned:"+id, qHeard)
	args := []any{id, qTTL, 0, qClaim, qWake, 0}
	for _, l := range limits {
		args = append(args, l)
	}
	require.NoError(rig.t, abandonScript.Run(context.Background(), rig.rdb, ks, args...).Err())
}

// The summary is exact after every call: tickets of one and two keys and
// of several units queue, are granted, claim, are given back under a
// lowered limit, withdraw, lose their process, have their grants lapse;
// holders release; newcomers pass heavy waiters (charged) and the store
// loses its data now and then.
func TestQueueSummaryFollowsTheQueue(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	rig.alive("p2")
	keysets := [][]string{{qKey}, {qKey}, {qKey}, {qKey2}, {qKey2}, {qKey, qKey2}}
	type tk struct{ ticket }
	var tickets []*tk
	var marked, charged int
	for seed := range uint64(30) {
		require.NoError(t, rig.rdb.FlushAll(ctx).Err())
		rig.alive("p1")
		rig.alive("p2")
		tickets = tickets[:0]
		rng := rand.New(rand.NewPCG(seed, 3))
		for step := range 150 {
			limit := 4 + rng.IntN(3) // the callers' limits differ and change
			limits := func(n int) []int {
				ls := make([]int, n)
				for i := range ls {
					ls[i] = limit
				}
				return ls
			}
			what := ""
			switch r := rng.IntN(20); {
			case r < 7 || len(tickets) == 0: // a newcomer
				keys := keysets[rng.IntN(len(keysets))]
				tc := &tk{ticket: ticket{id: fmt.Sprint("t", seed, "-", step), proc: []string{"p1", "p2"}[rng.IntN(2)],
					flow: fmt.Sprint("f", rng.IntN(3)), rank: uint8(rng.IntN(2)), wait: rng.IntN(4) > 0,
					units: []int{1, 1, 2, 3, 4}[rng.IntN(5)], keys: keys}}
				tickets = append(tickets, tc)
				what = fmt.Sprintf("admit %s %v %d units", tc.id, keys, tc.units)
				rig.admit(tc.ticket, limit)
			case r < 11: // a waiter asks, or claims its grant
				tc := tickets[rng.IntN(len(tickets))]
				tc.wait = true
				what = "ask " + tc.id
				rig.admit(tc.ticket, limit)
			case r < 15: // a holder releases (its grant, if it has one)
				tc := tickets[rng.IntN(len(tickets))]
				claim := qClaim
				if rng.IntN(3) == 0 {
					claim = 1 // the grants it makes lapse at once
				}
				what = "release " + tc.id
				rig.releaseFrom(tc.id, tc.keys, limits(len(tc.keys)), claim)
			case r < 17: // a waiter or a holder gives up
				tc := tickets[rng.IntN(len(tickets))]
				what = "abandon " + tc.id
				rig.abandonOn(tc.id, tc.keys, limits(len(tc.keys)))
			case r < 18: // p2 dies, or comes back
				if rng.IntN(2) == 0 {
					what = "p2 dies"
					require.NoError(t, rig.rdb.HSet(ctx, qProcs, "p2", 1).Err())
				} else {
					what = "p2 lives"
					rig.alive("p2")
				}
			case r < 19: // the limit of a waiter of two keys drops to 0 on one, or not
				tc := tickets[rng.IntN(len(tickets))]
				if len(tc.keys) == 2 {
					tc.limits = []int{limit, limit * rng.IntN(2)}
				}
				what = "limits " + tc.id
				rig.admit(tc.ticket, limit)
			default:
				if rng.IntN(4) == 0 {
					what = "data lost"
					require.NoError(t, rig.rdb.FlushAll(ctx).Err())
					rig.alive("p1")
					rig.alive("p2")
				}
			}
			requireSummary(t, rig, fmt.Sprintf("seed %d step %d (%s)", seed, step, what))
			for _, k := range []string{qKey, qKey2} {
				if want, _ := summaryOf(t, rig, k); want != nil && want["x"] != "0" {
					marked++
				}
				if us, _ := rig.rdb.HKeys(ctx, k+"#t").Result(); strings.Contains(strings.Join(us, " "), "u|") {
					charged++
				}
			}
		}
	}
	// The run met what the summary counts.
	t.Logf("steps with a marked queue: %d, with a charged ticket: %d", marked, charged)
	require.NotZero(t, marked, "no queue with a ticket of several keys or charged")
	require.NotZero(t, charged, "no charged ticket")
}

// heavyBehindHead builds a queue whose head A (3 units, one key, under
// its bound) a newcomer may pass, and B (2 units, one key) behind it, on
// qKey under 4 with 3 units held: a newcomer of one unit that waits takes
// the free unit unless B is at its bound.
func heavyBehindHead(t *testing.T, rig *queueRig) {
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "H", units: 3, flow: "f0"}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "B", units: 2, rank: 1, flow: "f0", wait: true}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "A", units: 3, rank: 0, flow: "f0", wait: true}, 4).status)
	requireSummary(t, rig, "A and B queued")
}

// The summary answers where no waiter behind the head is marked: the
// newcomer passes A (and charges it: the head's mark does not count); a
// newcomer that charges B to its bound, while B is the head, marks it,
// and once A is queued before it no newcomer passes (the conformance
// suite's NewcomerDoesNotPassAtBound).
func TestQueueSummaryNewcomerPassesOrNot(t *testing.T) {
	rig := newQueueRig(t)
	heavyBehindHead(t, rig)
	for _, n := range []string{"N1", "N2"} {
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: n, rank: 1, flow: "f0", wait: true}, 4).status, n)
		requireSummary(t, rig, n+" passed A")
		rig.release(n, 4)
	}

	rig = newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "H", units: 3, flow: "f0"}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "B", units: 2, rank: 1, flow: "f0", wait: true}, 4).status)
	// N, of another flow, passes B: 2 * PassFactor units charged, B's bound.
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "N", rank: 1, flow: "f1", wait: true}, 4).status)
	requireSummary(t, rig, "N passed B")
	rig.release("N", 4)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "A", units: 3, rank: 0, flow: "f0", wait: true}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "C", rank: 1, flow: "f1", wait: true}, 4).status,
		"a newcomer passed B, at its bound")
	requireSummary(t, rig, "C queued")
}

// A script of the release before keeps no summary: what it changes in a
// queue makes the summary untrusted until the queue empties, and the
// newcomer's look reads the waiters. Each case does by hand what such a
// script does, behind a head a newcomer may pass: it charges B (to its
// bound), or it queues a waiter of several keys; a newcomer then does not
// pass. With the summary trusted (xi, xs and xe as this release left
// them), it would. (A ticket this release has charged is marked however
// little: a later charge by the release before changes nothing the
// summary says.)
func TestQueueSummaryOfAReleaseBefore(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		old  func(rig *queueRig)
	}{
		{"charge", func(rig *queueRig) {
			require.NoError(t, rig.rdb.HIncrBy(ctx, qKey+"#t", "u|B", int64(driver.PassFactor*2)).Err())
		}},
		{"enqueue", func(rig *queueRig) { oldEnqueue(t, rig) }},
		{"queue begun before", func(rig *queueRig) {
			// A queue a script of the release before began has no xi
			// (the fields this release adds to are no summary): here
			// the only thing missing, with W queued by this release.
			require.Equal(t, acquireQueued, rig.admit(ticket{id: "W", units: 2, keys: []string{qKey, qKey2}, wait: true}, 4).status)
			require.NoError(t, rig.rdb.HIncrBy(ctx, qKey+"#v", "x", -1).Err())
			require.NoError(t, rig.rdb.HDel(ctx, qKey+"#v", "xi").Err())
		}},
		{"enqueue, and B leaves", func(rig *queueRig) {
			// The queue and its hash are as long as before: the sequence
			// tells.
			oldEnqueue(t, rig)
			m, err := rig.rdb.HGet(ctx, qKey+"#t", "B").Result()
			require.NoError(t, err)
			require.NoError(t, rig.rdb.ZRem(ctx, qKey+"#q", m).Err())
			require.NoError(t, rig.rdb.ZRem(ctx, qKey+"#m", "B").Err())
			require.EqualValues(t, 7, rig.rdb.HDel(ctx, qKey+"#t", "B", "f|B", "a|B", "s|B", "e|B", "k|B", "w|B").Val())
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig := newQueueRig(t)
			heavyBehindHead(t, rig)
			c.old(rig)
			require.Equal(t, acquireQueued, rig.admit(ticket{id: "C", rank: 1, flow: "f1", wait: true}, 4).status,
				"a newcomer passed a waiter it must not pass")
		})
	}
}

// oldEnqueue queues W, of two units on qKey and qKey2, on qKey as a
// script of the release before does: with no summary.
func oldEnqueue(t *testing.T, rig *queueRig) {
	ctx := context.Background()
	seq, err := rig.rdb.HIncrBy(ctx, qKey+"#v", "seq", 1).Result()
	require.NoError(t, err)
	m := fmt.Sprintf("1|%020.6f|%012d|p1|W", 0.0, seq)
	require.NoError(t, rig.rdb.ZAdd(ctx, qKey+"#q", redis.Z{Member: m}).Err())
	require.NoError(t, rig.rdb.HSet(ctx, qKey+"#t", "W", m, "f|W", "f0", "a|W", 99, "s|W", 0, "e|W", 1,
		"k|W", `[["`+qKey+`",4],["`+qKey2+`",4]]`, "w|W", 2).Err())
	require.NoError(t, rig.rdb.ZAdd(ctx, qKey+"#m", redis.Z{Score: 2, Member: "W"}).Err())
}

// An eviction takes a queue (<k>#q, its hash of counts and <k>#m) and
// leaves its tickets' hash: a waiter's next call queues it again, and its
// fields are there already, charged to its bound here. The summary that
// begins then counts it (its u| is what the walk reads), so a newcomer
// does not pass it.
func TestQueueSummaryAfterAnEviction(t *testing.T) {
	ctx := context.Background()
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "H", units: 3, flow: "f0"}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "B", units: 2, rank: 1, flow: "f0", wait: true}, 4).status)
	// N, of another flow, passes B: 2 * PassFactor units charged, B's bound.
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "N", rank: 1, flow: "f1", wait: true}, 4).status)
	rig.release("N", 4)
	require.NoError(t, rig.rdb.Del(ctx, qKey+"#q", qKey+"#v", qKey+"#m").Err())
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "B", units: 2, rank: 1, flow: "f0", wait: true}, 4).status)
	requireSummary(t, rig, "B queued again")
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "A", units: 3, rank: 0, flow: "f0", wait: true}, 4).status)
	requireSummary(t, rig, "A queued")
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "C", rank: 1, flow: "f1", wait: true}, 4).status,
		"a newcomer passed B, at its bound")
}

// A key whose name holds "],[" makes the k| of a ticket of that key alone
// read as one of several keys where the look reads it: the summary counts
// it as the look does (marked), not by the number of keys.
func TestQueueSummaryOfAnOddKeyName(t *testing.T) {
	rig := newQueueRig(t)
	odd := "q{n}:a],[b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "H", units: 3, flow: "f0", keys: []string{odd}}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "B", units: 2, flow: "f0", wait: true, keys: []string{odd}}, 4).status)
	want, got := summaryOf(t, rig, odd)
	require.Equal(t, want, got, "the summary of %s", odd)
}
