package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// The queue's scripts on a real redis-server: the order they keep, the
// hand-off on release and its claim window, liveness, and the bounds.

const (
	qTTL   = 60_000 // ms
	qClaim = 2_000  // ms
)

// queueRig runs the scripts on a real redis-server, for keys of the
// Registry name "n" under the prefix "q".
type queueRig struct {
	t   testing.TB
	rdb *redis.Client
}

const (
	qKey   = "q{n}:k"
	qProcs = "q{n}#procs"
	qHeard = "q{n}#heard"
	qWake  = "q{n}#wake:"
)

func newQueueRig(t testing.TB) *queueRig {
	srv := redistest.Start(t)
	rig := &queueRig{t: t, rdb: srv.Client()}
	rig.alive("p1")
	return rig
}

func (rig *queueRig) alive(proc string) {
	require.NoError(rig.t, aliveScript.Run(context.Background(), rig.rdb, []string{qProcs}, proc, qTTL).Err())
}

// ticket is a caller as the acquire script sees it.
type ticket struct {
	id, proc, flow string
	rank           uint8
	weight         int
	wait           bool
	maxQ, maxFlow  int      // 0: none
	units          int      // 0: 1
	keys           []string // default: qKey
	limits         []int    // default: the limit admit is given, for each key
}

// queueReply is what the acquire script found.
type queueReply struct {
	status, index, count int
	earliest, now        int64
	queued               int
}

// admit runs the acquire script for tk under limit.
func (rig *queueRig) admit(tk ticket, limit int) queueReply {
	rig.t.Helper()
	if tk.proc == "" {
		tk.proc = "p1"
	}
	tk.weight = max(tk.weight, 1)
	if tk.keys == nil {
		tk.keys = []string{qKey}
	}
	bound := func(n int) int {
		if n == 0 {
			return -1
		}
		return n
	}
	wait := 0
	if tk.wait {
		wait = 1
	}
	keys := append([]string{"q{n}#epoch", "q{n}#pause", "q{n}:abandoned:" + tk.id, qProcs}, tk.keys...)
	args := []any{tk.id, qTTL, len(tk.keys), 0, 0, 0, wait, qClaim, tk.rank, tk.flow, tk.weight,
		tk.proc, qWake, bound(tk.maxQ), bound(tk.maxFlow), qTTL, max(tk.units, 1)}
	for i := range tk.keys {
		if tk.limits != nil {
			args = append(args, tk.limits[i])
		} else {
			args = append(args, limit)
		}
	}
	res, err := acquireScript.Run(context.Background(), rig.rdb, append(keys, qHeard), args...).Int64Slice()
	require.NoError(rig.t, err)
	requireReply(rig.t, res, len(tk.keys))
	return queueReply{status: int(res[0]), index: int(res[1]), count: int(res[2]), earliest: res[3], now: res[4], queued: int(res[6])}
}

// release removes lease id from qKey (limit) and serves the queue.
func (rig *queueRig) release(id string, limit int) {
	rig.t.Helper()
	rig.releaseFrom(id, []string{qKey}, []int{limit}, qClaim)
}

func (rig *queueRig) releaseFrom(id string, keys []string, limits []int, claim int) {
	rig.t.Helper()
	args := []any{claim, qWake}
	for i := range keys {
		args = append(args, id, limits[i])
	}
	keys = append([]string{"q{n}#pause", qProcs}, keys...)
	require.NoError(rig.t, releaseScript.Run(context.Background(), rig.rdb, append(keys, qHeard), append(args, qTTL, 0)...).Err())
}

// withdraw takes ticket id back: its place, or its grant, on qKey.
func (rig *queueRig) withdraw(id string, limit int) {
	rig.t.Helper()
	keys := []string{"q{n}#pause", qProcs, qKey, "q{n}:abandoned:" + id, qHeard}
	require.NoError(rig.t, abandonScript.Run(context.Background(), rig.rdb, keys, id, qTTL, 0, qClaim, qWake, 0, limit).Err())
}

// serverMS returns the server's clock in milliseconds, as the scripts
// read it.
func (rig *queueRig) serverMS() float64 {
	rig.t.Helper()
	now, err := rig.rdb.Time(context.Background()).Result()
	require.NoError(rig.t, err)
	return float64(now.UnixMilli())
}

// holders returns the key's lease ids, by expiry.
func (rig *queueRig) holders() []string {
	return rig.holdersOf(qKey)
}

func (rig *queueRig) holdersOf(key string) []string {
	ids, err := rig.rdb.ZRange(context.Background(), key, 0, -1).Result()
	require.NoError(rig.t, err)
	return ids
}

// handOff frees held's lease and returns the ticket granted in its place
// ("" if none), checking that it holds a lease of the claim window.
func (rig *queueRig) handOff(held string, limit int) string {
	rig.t.Helper()
	before := map[string]bool{}
	for _, id := range rig.holders() {
		before[id] = true
	}
	require.True(rig.t, before[held], "%s held a lease", held)
	rig.release(held, limit)
	for _, id := range rig.holders() {
		if !before[id] {
			return id
		}
	}
	return ""
}

func TestQueueHandsOffInOrder(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	sub := rig.rdb.Subscribe(ctx, qWake+"p1")
	defer sub.Close()
	_, err := sub.Receive(ctx) // subscribed
	require.NoError(t, err)

	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "a"}, 2).status)
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "b"}, 2).status)
	rp := rig.admit(ticket{id: "c"}, 2)
	assert.Equal(t, acquireFull, rp.status, "full, and c does not wait")
	assert.Equal(t, 2, rp.count)
	assert.Greater(t, rp.earliest, rp.now, "the earliest expiry, for Retry-After")

	assert.Equal(t, acquireQueued, rig.admit(ticket{id: "c", wait: true}, 2).status)
	rp = rig.admit(ticket{id: "d", wait: true}, 2)
	assert.Equal(t, acquireQueued, rp.status)
	assert.Equal(t, 2, rp.queued)
	assert.Equal(t, acquireQueued, rig.admit(ticket{id: "c", wait: true}, 2).status, "asked again: still queued")
	assert.Equal(t, acquireFull, rig.admit(ticket{id: "e"}, 2).status, "a newcomer does not pass the queue")

	assert.Equal(t, "c", rig.handOff("a", 2), "the head takes the freed lease")
	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	assert.Equal(t, "c", msg.Payload, "its process is told which ticket")
	score, err := rig.rdb.ZScore(ctx, qKey, "c").Result()
	require.NoError(t, err)
	rp = rig.admit(ticket{id: "c", wait: true}, 2)
	require.Equal(t, acquireAdmitted, rp.status, "c claims its grant")
	claimed, err := rig.rdb.ZScore(ctx, qKey, "c").Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(rp.now+qTTL), claimed, 1000, "the claim extends the lease to the TTL")
	assert.Less(t, score, claimed)
	assert.Equal(t, acquireQueued, rig.admit(ticket{id: "d", wait: true}, 2).status)
}

func TestQueueOrderClassThenArrival(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	for _, tk := range []ticket{{id: "b1", rank: 2}, {id: "b2", rank: 2}, {id: "i1", rank: 0}, {id: "s1", rank: 1}, {id: "i2", rank: 0}} {
		tk.wait = true
		require.Equal(t, acquireQueued, rig.admit(tk, 1).status)
	}
	var order []string
	held := "x"
	for range 5 {
		held = rig.handOff(held, 1)
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: held, wait: true}, 1).status)
		order = append(order, held)
	}
	assert.Equal(t, []string{"i1", "i2", "s1", "b1", "b2"}, order, "by class, then in arrival order")
}

func TestQueueFlowsShareByWeight(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	// The heavy flow queues all its waiters first; the light one comes
	// after, with three times its weight.
	for i := range 40 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("a", i), flow: "a", weight: 1, wait: true}, 1).status)
	}
	for i := range 40 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("b", i), flow: "b", weight: 3, wait: true}, 1).status)
	}
	got := map[byte]int{}
	held := "x"
	var order []string
	for range 40 {
		held = rig.handOff(held, 1)
		got[held[0]]++
		order = append(order, held)
	}
	assert.InDelta(t, 10, got['a'], 1, "flow a, weight 1: %v", order)
	assert.InDelta(t, 30, got['b'], 1, "flow b, weight 3: %v", order)
	// Within a flow, arrival order.
	var as []string
	for _, id := range order {
		if id[0] == 'a' {
			as = append(as, id)
		}
	}
	for i, id := range as {
		assert.Equal(t, fmt.Sprint("a", i), id)
	}
}

func TestQueueSkipsADeadProcess(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "dead", proc: "p2", wait: true}, 1).status)
	require.NoError(t, rig.rdb.HSet(ctx, qProcs, "p2", 1).Err()) // then p2 died: its deadline passed long ago
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "live", wait: true}, 1).status)
	assert.Equal(t, "live", rig.handOff("x", 1), "the dead process's ticket is dropped, not granted")
	n, err := rig.rdb.ZCard(ctx, qKey+"#q").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestQueueClaimWindow(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "slow", wait: true}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "next", wait: true}, 1).status)
	const claim = 50 // ms
	rig.releaseFrom("x", []string{qKey}, []int{1}, claim)
	assert.Equal(t, []string{"slow"}, rig.holders(), "granted for the claim window")
	// slow never claims: once the window has passed, the next script call
	// (here next's own, as it polls) hands the lease on.
	var rp queueReply
	require.Eventually(t, func() bool {
		rp = rig.admit(ticket{id: "next", wait: true}, 1)
		return rp.status != acquireQueued
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, acquireAdmitted, rp.status, "next is served and claims in one call")
	assert.Equal(t, []string{"next"}, rig.holders())
}

func TestQueueBounds(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	tk := func(id, flow string) ticket {
		return ticket{id: id, flow: flow, wait: true, maxQ: 3, maxFlow: 2}
	}
	assert.Equal(t, acquireQueued, rig.admit(tk("a1", "a"), 1).status)
	assert.Equal(t, acquireQueued, rig.admit(tk("a2", "a"), 1).status)
	assert.Equal(t, acquireFlowMax, rig.admit(tk("a3", "a"), 1).status, "flow a has 2 queued")
	assert.Equal(t, acquireQueued, rig.admit(tk("b1", "b"), 1).status)
	rp := rig.admit(tk("c1", "c"), 1)
	assert.Equal(t, acquireQueueMax, rp.status, "3 queued")
	assert.Equal(t, 3, rp.queued)

	rig.withdraw("a1", 1)
	assert.Equal(t, acquireQueued, rig.admit(tk("a3", "a"), 1).status, "flow a has room again")
}

func TestQueueLeaveGrantedHandsOn(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "w1", wait: true}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "w2", wait: true}, 1).status)
	require.Equal(t, "w1", rig.handOff("x", 1))
	// w1's caller gave up before it claimed: its grant goes to w2.
	rig.withdraw("w1", 1)
	assert.Equal(t, []string{"w2"}, rig.holders())
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "w2", wait: true}, 1).status)
	// The queue is empty: its keys are gone, tags start anew.
	n, err := rig.rdb.Exists(context.Background(), qKey+"#q", qKey+"#t", qKey+"#v").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// A ticket of two keys waits on both, holding nothing: grants of one key
// pass it over while its other key is full, and after registry.MaxPassed
// of them the key keeps one place for it, whatever else waits, until its
// other key has room; then it is granted on both at once.
func TestQueueTwoKeysKeepAPlaceAfterMaxPassed(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	both := []string{a, b}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xa"}, 2).status) // a: 2 of 2
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xa2"}, 2).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xb", keys: []string{b}}, 1).status) // b: 1 of 1
	m := rig.admit(ticket{id: "m", keys: both, limits: []int{2, 1}, wait: true}, 0)
	require.Equal(t, acquireQueued, m.status)
	assert.Equal(t, 1, m.index, "a is the first key without room")
	for i := range registry.MaxPassed + 2 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("s", i), wait: true}, 2).status)
	}
	// Each release of a passes m over (b is full) and grants the next
	// single-key waiter, until m has been passed MaxPassed times.
	held := "xa"
	for i := range registry.MaxPassed {
		got := rig.handOff(held, 2)
		require.Equal(t, fmt.Sprint("s", i), got, "pass %d", i+1)
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: got, wait: true}, 2).status)
		held = got
	}
	// Now a keeps its freed place for m: the next waiter does not get it,
	// nor does a newcomer.
	assert.Empty(t, rig.handOff(held, 2), "a keeps the place for m")
	assert.Len(t, rig.holders(), 1)
	assert.Equal(t, acquireFull, rig.admit(ticket{id: "new"}, 2).status, "the kept place is not a newcomer's")
	// b frees: m takes both places at once.
	rig.releaseFrom("xb", []string{b}, []int{1}, qClaim)
	assert.Contains(t, rig.holders(), "m")
	assert.Equal(t, []string{"m"}, rig.holdersOf(b))
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "m", keys: both, limits: []int{2, 1}, wait: true}, 0).status)
	n, err := rig.rdb.ZCard(context.Background(), a+"#u").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no place kept once m is served")
}

// However many tickets a key has passed over too often, it keeps one place
// for them, not one each: the rest of its capacity stays everyone's.
func TestQueueKeepsOnePlaceForAllUrgentTickets(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xb", keys: []string{b}}, 1).status) // b full
	for i := range 3 {
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: fmt.Sprint("x", i)}, 3).status) // a full
	}
	for i := range 3 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("m", i), keys: []string{a, b}, limits: []int{3, 1}, wait: true}, 0).status)
	}
	// Mark all three urgent on a, as MaxPassed pass-overs would.
	for i := range 3 {
		id := fmt.Sprint("m", i)
		arrival, err := rig.rdb.HGet(ctx, a+"#t", "a|"+id).Float64()
		require.NoError(t, err)
		require.NoError(t, rig.rdb.ZAdd(ctx, a+"#u", redis.Z{Score: arrival, Member: id}).Err())
	}
	rig.release("x0", 3)
	rig.release("x1", 3)
	// Two places free on a, one kept: a newcomer takes the other.
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "n1"}, 3).status)
	assert.Equal(t, acquireFull, rig.admit(ticket{id: "n2"}, 3).status)
}

// Two tickets of two keys, each urgent on one key and waiting for the
// other, do not keep each other out: a kept place binds only the tickets
// that came after its urgent one, so the older takes both places once both
// keys are free. (Each key keeps its own order, so X can be urgent on a
// while it waits for b, and Y urgent on b while it waits for a.)
func TestQueueUrgentTicketsDoNotDeadlock(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const a, b = qKey, "q{n}:b"
	ab := []string{a, b}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha"}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "X", keys: ab, limits: []int{1, 1}, wait: true}, 0).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "Y", keys: ab, limits: []int{1, 1}, wait: true}, 0).status)
	// X urgent on a, Y on b, as MaxPassed pass-overs on each would make
	// them.
	for _, u := range []struct{ key, id string }{{a, "X"}, {b, "Y"}} {
		arrival, err := rig.rdb.HGet(ctx, u.key+"#t", "a|"+u.id).Float64()
		require.NoError(t, err)
		require.NoError(t, rig.rdb.ZAdd(ctx, u.key+"#u", redis.Z{Score: arrival, Member: u.id}).Err())
	}
	rig.releaseFrom("ha", []string{a}, []int{1}, qClaim)
	rig.releaseFrom("hb", []string{b}, []int{1}, qClaim)
	assert.Equal(t, []string{"X"}, rig.holdersOf(a), "X came first: b's place kept for Y does not bind it")
	assert.Equal(t, []string{"X"}, rig.holdersOf(b))
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "X", keys: ab, limits: []int{1, 1}, wait: true}, 0).status)
}

// A ticket queued under a limit that has dropped since is not admitted
// over the new one: its claim gives the grant back. And one queued under
// a limit raised since is served by the new one (its calls carry it).
func TestQueueLimitChangesWhileQueued(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	ab := []string{a, b}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha", keys: []string{a}}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 5).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "X", keys: ab, limits: []int{1, 5}, wait: true}, 0).status)
	// b's limit drops to 1 (it has one holder), and a frees: X's grant,
	// under its old limit of b, is over the new one.
	rig.releaseFrom("ha", []string{a}, []int{1}, qClaim)
	rp := rig.admit(ticket{id: "X", keys: ab, limits: []int{1, 1}, wait: true}, 0)
	assert.NotEqual(t, acquireAdmitted, rp.status)
	assert.Equal(t, []string{"hb"}, rig.holdersOf(b), "b's limit of 1 holds")

	// Raised: the queued ticket's next call takes the room.
	rig2 := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig2.admit(ticket{id: "ha", keys: []string{a}}, 1).status)
	require.Equal(t, acquireAdmitted, rig2.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	require.Equal(t, acquireQueued, rig2.admit(ticket{id: "X", keys: ab, limits: []int{1, 1}, wait: true}, 0).status)
	assert.Equal(t, acquireAdmitted, rig2.admit(ticket{id: "X", keys: ab, limits: []int{5, 5}, wait: true}, 0).status)
}

// A release made under a limit higher than the one in force now (another
// process's, or its admission's) hands nothing on past the limit: the
// waiter's claim, under the limit now, gives it back.
func TestQueueGrantUnderAnOldLimitIsGivenBack(t *testing.T) {
	rig := newQueueRig(t)
	for _, id := range []string{"h1", "h2", "h3"} {
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: id}, 3).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "W", wait: true}, 1).status)
	rig.releaseFrom("h1", []string{qKey}, []int{3}, qClaim)
	assert.NotEqual(t, acquireAdmitted, rig.admit(ticket{id: "W", wait: true}, 1).status)
	assert.ElementsMatch(t, []string{"h2", "h3"}, rig.holders())
}

// Serving looks at a bounded number of waiters from the head. One further
// back that can take the room takes it on its own next call, and a
// newcomer does not pass it meanwhile.
func TestQueueWaiterBeyondTheScanIsNotStranded(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha"}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	for i := range 64 { // more than serve looks at, all waiting for b
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("x", i), keys: []string{a, b}, limits: []int{1, 1}, wait: true}, 0).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "S", wait: true}, 1).status)
	rig.release("ha", 1)
	assert.Equal(t, acquireFull, rig.admit(ticket{id: "newcomer"}, 1).status, "S could take the room")
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "S", wait: true}, 1).status)
}

// A flow whose waiters all left (withdrawn, timed out, dropped) starts
// again from the virtual time, not behind the turns it never used; and
// its fields in the queue's state go with its last waiter.
func TestQueueIdleFlowStartsAfresh(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	for i := range 20 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("b", i), flow: "b", wait: true}, 1).status)
	}
	for i := range 20 {
		id := fmt.Sprint("a", i)
		require.Equal(t, acquireQueued, rig.admit(ticket{id: id, flow: "a", wait: true}, 1).status)
		rig.withdraw(id, 1)
	}
	fields, err := rig.rdb.HKeys(ctx, qKey+"#v").Result()
	require.NoError(t, err)
	for _, f := range fields {
		assert.NotContains(t, f, "|a", "flow a's fields went with its last waiter")
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "anew", flow: "a", wait: true}, 1).status)
	assert.True(t, rig.grantedWithin("x", "anew", 3, ticket{flow: "b", wait: true}),
		"flow a's new waiter waited behind flow b's backlog")
}

// Where serving stops short, with room left that none of the waiters it
// looked at can take, a newcomer looks further, and takes the room if
// nobody there can.
func TestQueueNewcomerTakesRoomNoWaiterCanTake(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha"}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	for i := range 64 { // all waiting for b, which stays held
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("x", i), keys: []string{a, b}, limits: []int{1, 1}, wait: true}, 0).status)
	}
	rig.release("ha", 1)
	require.Empty(t, rig.holdersOf(a))
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "try"}, 1).status)
}

// A grant given back by its claim (over a lowered limit) is served at
// once: the next waiter gets the place.
func TestQueueGivenBackGrantIsServed(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	ab := []string{a, b}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha"}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 5).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "X", keys: ab, limits: []int{1, 5}, wait: true}, 0).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "Y", wait: true}, 1).status)
	rig.release("ha", 1)
	require.Equal(t, []string{"X"}, rig.holdersOf(a))
	rp := rig.admit(ticket{id: "X", keys: ab, limits: []int{1, 1}, wait: true}, 0)
	require.Equal(t, acquireQueued, rp.status, "X's claim over b's limit gives the grant back; X waits again")
	assert.Equal(t, []string{"Y"}, rig.holdersOf(a), "a's place goes to Y")
}

// A waiter whose grant is given back waits again even with the queue at
// its bound: it was within it.
func TestQueueGivenBackWaiterIsNotOverTheBound(t *testing.T) {
	rig := newQueueRig(t)
	for _, id := range []string{"h1", "h2", "h3"} {
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: id}, 3).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "W", wait: true, maxQ: 2}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "V", wait: true, maxQ: 2}, 1).status)
	rig.releaseFrom("h1", []string{qKey}, []int{3}, qClaim) // under the old limit: W is granted
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "Z", wait: true, maxQ: 2}, 1).status)
	assert.Equal(t, acquireQueued, rig.admit(ticket{id: "W", wait: true, maxQ: 2}, 1).status)
}

// A key's urgent set expires with its queue, and an entry left in it for
// a ticket no longer queued (its queue expired) keeps no place.
func TestQueueStaleUrgentEntryKeepsNoPlace(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha"}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "X", keys: []string{a, b}, limits: []int{1, 1}, wait: true}, 0).status)
	for i := range registry.MaxPassed {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("s", i), wait: true}, 1).status)
	}
	held := "ha"
	for range registry.MaxPassed { // each grant on a passes X over (b is full)
		held = rig.handOff(held, 1)
		require.NotEmpty(t, held)
	}
	require.Equal(t, []string{"X"}, rig.rdb.ZRange(ctx, a+"#u", 0, -1).Val())
	pttl, err := rig.rdb.PTTL(ctx, a+"#u").Result()
	require.NoError(t, err)
	assert.Positive(t, pttl, "a#u expires with its queue")
	// The queues' state lapses (as after 3 TTLs with nobody asking), all
	// but the urgent set.
	require.NoError(t, rig.rdb.Del(ctx, a+"#q", a+"#t", a+"#v", b+"#q", b+"#t", b+"#v").Err())
	rig.release(held, 1)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "n1"}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "w1", wait: true}, 1).status)
	rig.release("n1", 1)
	assert.Equal(t, []string{"w1"}, rig.holdersOf(a), "w1, the only waiter, takes a's free place")
}

// A dead process's urgent ticket keeps no place, even where serving does
// not reach it.
func TestQueueDeadUrgentTicketKeepsNoPlace(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const a, b = qKey, "q{n}:b"
	rig.alive("p2")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha"}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "U", proc: "p2", rank: 1, keys: []string{a, b}, limits: []int{1, 1}, wait: true}, 0).status)
	arrival, err := rig.rdb.HGet(ctx, a+"#t", "a|U").Float64()
	require.NoError(t, err)
	require.NoError(t, rig.rdb.ZAdd(ctx, a+"#u", redis.Z{Score: arrival, Member: "U"}).Err()) // as MaxPassed pass-overs would
	for i := range 64 {                                                                       // later, and ahead of U (a higher class)
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("h", i), rank: 0, wait: true}, 1).status)
	}
	require.NoError(t, rig.rdb.HSet(ctx, qProcs, "p2", 1).Err()) // p2 died long ago
	rig.release("ha", 1)
	assert.Equal(t, []string{"h0"}, rig.holdersOf(a), "the first waiter gets the place")
}

// Serving that stops at its bound while dropping a dead process's
// waiters at the head still says so: a newcomer does not pass the live
// waiter behind them.
func TestQueueStopAtTheHeadIsReported(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	rig.alive("p2")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	for i := range 512 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("d", i), proc: "p2", wait: true}, 1).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "S", wait: true}, 1).status)
	require.NoError(t, rig.rdb.HSet(ctx, qProcs, "p2", 1).Err()) // p2 died
	rig.release("x", 1)
	require.Empty(t, rig.holders(), "serving stopped at its bound among the dead")
	assert.NotEqual(t, acquireAdmitted, rig.admit(ticket{id: "N"}, 1).status, "the newcomer does not pass S")
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "S", wait: true}, 1).status)
}

// A flow with waiters in two classes whose waiters of one class all leave
// without a grant is not charged there for the turns they never used.
func TestQueueTwoClassFlowIsNotChargedForUnusedTurns(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	for i := range 20 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("b", i), flow: "b", rank: 1, wait: true}, 1).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "hi", flow: "a", rank: 0, wait: true}, 1).status)
	for i := range 20 {
		id := fmt.Sprint("a", i)
		require.Equal(t, acquireQueued, rig.admit(ticket{id: id, flow: "a", rank: 1, wait: true}, 1).status)
		rig.withdraw(id, 1)
	}
	require.Equal(t, "hi", rig.handOff("x", 1))
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hi", flow: "a", wait: true}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "anew", flow: "a", rank: 1, wait: true}, 1).status)
	assert.True(t, rig.grantedWithin("hi", "anew", 3, ticket{flow: "b", rank: 1, wait: true}),
		"flow a's new waiter waited behind flow b's backlog")
}

// The virtual time does not go back when a ticket of two keys, passed
// over while others were granted, is granted at last: a new flow does not
// take turn after turn from a backlog.
func TestQueueVirtualTimeOnlyMovesForward(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	ab := []string{a, b}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x1"}, 2).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x2"}, 2).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "X", flow: "x", keys: ab, limits: []int{2, 1}, wait: true}, 0).status)
	for i := range 30 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("b", i), flow: "b", wait: true}, 2).status)
	}
	held := "x1"
	for i := range 7 { // X is passed over: b is full
		held = rig.handOff(held, 2)
		require.Equal(t, fmt.Sprint("b", i), held)
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: held, flow: "b", wait: true}, 2).status)
	}
	rig.releaseFrom("hb", []string{b}, []int{1}, qClaim)
	require.Equal(t, "X", rig.handOff(held, 2))
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "X", flow: "x", keys: ab, limits: []int{2, 1}, wait: true}, 0).status)
	held = "X"
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "d0", flow: "d", wait: true}, 2).status)
	got := map[byte]int{}
	var order []string
	next := 1
	for range 6 {
		held = rig.handOff(held, 2)
		require.NotEmpty(t, held)
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: held, flow: held[:1], wait: true}, 2).status)
		got[held[0]]++
		order = append(order, held)
		if held[0] == 'd' { // a closed loop
			require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("d", next), flow: "d", wait: true}, 2).status)
			next++
		}
	}
	assert.GreaterOrEqual(t, got['b'], 2, "the backlogged flow b takes turns with the new flow d: %v", order)
}

// A flow is charged for a turn granted out of order: a ticket of two keys,
// passed over while a later ticket of its flow was granted, is granted
// afterwards, and when the flow's last waiter then leaves, its finish tag
// does not go back below the later grant's.
func TestQueueGrantedTurnIsChargedOutOfOrder(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "h"}, 1).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	// flow f: X (a and b, tag 0), Y (a, tag 1), Z (a, tag 2)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "X", flow: "f", keys: []string{a, b}, wait: true}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "Y", flow: "f", wait: true}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "Z", flow: "f", wait: true}, 1).status)
	// a waiter of a lower class keeps the queue from emptying
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "G", flow: "g", rank: 2, wait: true}, 1).status)
	require.Equal(t, "Y", rig.handOff("h", 1), "X is passed over: b is full")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "Y", flow: "f", wait: true}, 1).status)
	rig.releaseFrom("hb", []string{b}, []int{1}, qClaim)
	require.Equal(t, "X", rig.handOff("Y", 1))
	rig.withdraw("Z", 1) // flow f's last waiter on a leaves
	f, err := rig.rdb.ZScore(ctx, a+"#f0", "f").Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, f, 2.0, "flow f was granted Y (start 1, finish 2): its finish tag must not go back below 2")
}

// grantedWithin hands the key (capped at 1) on from held up to n times,
// each granted waiter other than want claiming as a ticket like others,
// and reports whether want was granted.
func (rig *queueRig) grantedWithin(held, want string, n int, others ticket) bool {
	rig.t.Helper()
	for i := range n {
		held = rig.handOff(held, 1)
		if held == want {
			return true
		}
		others.id = held
		require.Equal(rig.t, acquireAdmitted, rig.admit(others, 1).status, "grant %d", i)
	}
	return false
}

// closedLoop makes n hand-offs of the key, capped at 1 and held by "x",
// between a backlog of 80 waiters of flow b (weight wb) and flow a
// (weight wa), whose callers (callers of them) each call again as their
// last is granted, through again(id). It returns the grants per flow and
// their order.
func (rig *queueRig) closedLoop(wa, wb, callers, n int, again func(id string, weight int)) (map[byte]int, []string) {
	rig.t.Helper()
	require.Equal(rig.t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	for i := range 80 {
		require.Equal(rig.t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("b", i), flow: "b", weight: wb, wait: true}, 1).status)
	}
	next := 0
	call := func() {
		again(fmt.Sprint("a", next), wa)
		next++
	}
	for range callers {
		call()
	}
	weight := map[byte]int{'a': wa, 'b': wb}
	held, got := "x", map[byte]int{}
	var order []string
	for range n {
		held = rig.handOff(held, 1)
		require.NotEmpty(rig.t, held)
		require.Equal(rig.t, acquireAdmitted, rig.admit(ticket{id: held, flow: held[:1], weight: weight[held[0]], wait: true}, 1).status)
		got[held[0]]++
		order = append(order, held)
		if held[0] == 'a' {
			call()
		}
	}
	return got, order
}

// Two flows of one weight, both always waiting, take turns, also when
// one of them queues its next caller only as its last is granted (a
// closed loop): a granted turn is paid for.
func TestQueueClosedLoopFlowTakesTurns(t *testing.T) {
	rig := newQueueRig(t)
	got, order := rig.closedLoop(1, 1, 1, 10, func(id string, weight int) {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: id, flow: "a", weight: weight, wait: true}, 1).status)
	})
	assert.InDelta(t, 5, got['b'], 1, "%v", order)
}

// Weighted turns hold when a flow's callers (one or two) queue, give up
// and queue again, against a backlog: a give-up returns its own turn, and
// the turns granted stay charged.
func TestQueueWeightedSplitWithRetryingCallers(t *testing.T) {
	for _, tc := range []struct{ wa, wb, callers int }{{1, 1, 1}, {3, 1, 1}, {1, 3, 1}, {1, 1, 2}, {3, 1, 2}, {1, 3, 2}} {
		t.Run(fmt.Sprintf("a%d-b%d-%dcallers", tc.wa, tc.wb, tc.callers), func(t *testing.T) {
			rig := newQueueRig(t)
			got, order := rig.closedLoop(tc.wa, tc.wb, tc.callers, 40, func(id string, weight int) {
				require.Equal(t, acquireQueued, rig.admit(ticket{id: id, flow: "a", weight: weight, wait: true}, 1).status)
				rig.withdraw(id, 1)
				require.Equal(t, acquireQueued, rig.admit(ticket{id: id + "r", flow: "a", weight: weight, wait: true}, 1).status)
			})
			assert.InDelta(t, 40*float64(tc.wa)/float64(tc.wa+tc.wb), got['a'], 2, "%v", order)
		})
	}
}

// aliveScript renews a process's liveness deadline, now plus ms, as a
// waiter's call does.
//
//	KEYS: the name's #procs
//	ARGV: process, ms
var aliveScript = redis.NewScript(baseLua + `
local ms = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], nowMS(redis.call('TIME')) + ms)
cover(KEYS[1], 2 * ms)
return 0
`)

// requireReply checks the length of an acquire script's reply for n
// keys, none of them learned: an admission's goes on with each key's
// count only for a learned key.
func requireReply(t testing.TB, res []int64, n int) {
	t.Helper()
	require.Len(t, res, replyLen, "%d keys", n)
}

// At driver.MaxTag, finish tags stop moving, so several waiters of a flow
// share one: the first waiter to reach it leaving gives no turn back, and
// the flow's waiters keep their order. The virtual time is set where a
// long backlog would have moved it.
func TestQueueFlowOrderAtMaxTag(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.NoError(t, rig.rdb.HSet(ctx, qKey+"#v", "V|0", driver.MaxTag-2.5).Err())
	// Tags: A1 MaxTag-2.5, A2 -1.5, A3 -0.5, A4 and A5 MaxTag; A3 is the
	// first whose finish is MaxTag.
	for i := 1; i <= 5; i++ {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("A", i), flow: "A", wait: true}, 1).status)
	}
	rig.withdraw("A3", 1)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "A6", flow: "A", wait: true}, 1).status)
	var order []string
	for held := "x"; len(order) < 5; {
		held = rig.handOff(held, 1)
		require.NotEmpty(t, held)
		order = append(order, held)
	}
	assert.Equal(t, []string{"A1", "A2", "A4", "A5", "A6"}, order)
}

// A ticket of several keys costs each key's turn by that key's limit: 3
// units are 3 steps of a key of 3, and 1 of a key of 3,000.
func TestQueueTurnCostPerKey(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const j = "q{n}:j"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x", units: 3}, 3).status)
	r := rig.admit(ticket{id: "A1", flow: "A", wait: true, units: 3, keys: []string{qKey, j}, limits: []int{3, 3000}}, 0)
	require.Equal(t, acquireQueued, r.status)
	for key, want := range map[string]float64{qKey: 3, j: 1} {
		got, err := rig.rdb.ZScore(ctx, key+"#f0", "A").Result()
		require.NoError(t, err)
		assert.Equal(t, want, got, key)
	}
}

// A claim whose lease is on its key within the caller's limit, where no
// lease has expired, is extended without serving the queue: it frees
// nothing. Where a lease has expired, its room goes to the waiter behind,
// as on any call: the claim takes the whole path, which serves. And a
// claim that finds its own lease expired is not admitted on a full key.
func TestQueueClaimServesWhereALeaseExpired(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "a"}, 2).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "b"}, 2).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "c", wait: true}, 2).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "d", wait: true}, 2).status)
	require.Equal(t, "c", rig.handOff("a", 2))
	require.NoError(t, rig.rdb.ZAdd(ctx, qKey, redis.Z{Score: 1, Member: "b"}).Err()) // b's lease has expired

	rp := rig.admit(ticket{id: "c", wait: true}, 2)
	require.Equal(t, acquireAdmitted, rp.status, "c claims its grant")
	claimed, err := rig.rdb.ZScore(ctx, qKey, "c").Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(rp.now+qTTL), claimed, 1000, "extended to the TTL")
	assert.ElementsMatch(t, []string{"c", "d"}, rig.holders(), "b's room served on c's claim: d granted it")

	// c's lease expires: its call drops it, and under a limit of 1 finds
	// the key full with d: c queues anew.
	require.NoError(t, rig.rdb.ZAdd(ctx, qKey, redis.Z{Score: 1, Member: "c"}).Err())
	assert.Equal(t, acquireQueued, rig.admit(ticket{id: "c", wait: true}, 1).status, "c's lease is gone: it queues again")
	assert.Equal(t, []string{"d"}, rig.holders())
}

// A claim counts the pairs it carries (leases admitted while Redis was
// unreachable) before it is judged: here they put the key over its limit,
// and the grant is given back.
func TestQueueClaimCountsItsCarriedPairs(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	ms := rig.serverMS()
	require.NoError(t, rig.rdb.ZAdd(ctx, qKey, redis.Z{Score: ms + qTTL, Member: "h"}, redis.Z{Score: ms + qClaim, Member: "x"}).Err())
	keys := []string{"q{n}#epoch", "q{n}#pause", "q{n}:abandoned:x", qProcs, qKey, qKey, "q{n}:abandoned:carried"}
	args := []any{"x", qTTL, 1, 0, 0, 0, 1, qClaim, 0, "", 1, "p1", qWake, -1, -1, qTTL, 1, 2, "carried", 1}
	res, err := acquireScript.Run(ctx, rig.rdb, append(keys, qHeard), args...).Int64Slice()
	require.NoError(t, err)
	assert.NotEqual(t, int64(acquireAdmitted), res[0], "the carried lease puts the key over 2")
	assert.ElementsMatch(t, []string{"h", "carried"}, rig.holders())
}

// A lease of two keys whose part on one ran out is not claimed on the
// other alone.
func TestQueueClaimNeedsEveryKey(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const b = "q{n}:b"
	ms := rig.serverMS()
	require.NoError(t, rig.rdb.ZAdd(ctx, qKey, redis.Z{Score: ms + qTTL, Member: "h"}, redis.Z{Score: 1, Member: "x"}).Err())
	require.NoError(t, rig.rdb.ZAdd(ctx, b, redis.Z{Score: ms + qClaim, Member: "x"}).Err())
	rp := rig.admit(ticket{id: "x", keys: []string{qKey, b}, limits: []int{1, 1}, wait: true}, 0)
	assert.NotEqual(t, acquireAdmitted, rp.status)
	assert.Equal(t, []string{"h"}, rig.holders())
	assert.Empty(t, rig.holdersOf(b))
}

// Every key of a queue expires with it: whichever script makes one gives
// it an expiry, and a waiter's call that finds less than 2 TTLs left
// covers them all to 3 again (noted in the hash of counts, c).
func TestQueueKeysAllExpire(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	keys := []string{qKey + "#q", qKey + "#t", qKey + "#v", qKey + "#u", qKey + "#m", qKey + "#f0", qKey + "#f1", qKey + "#f2"}
	expiring := func(step string) {
		t.Helper()
		for _, k := range keys {
			ms, err := rig.rdb.PTTL(ctx, k).Result()
			require.NoError(t, err)
			assert.NotEqual(t, time.Duration(-1), ms, "%s: %s has no expiry", step, k)
		}
	}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "a", flow: "a", wait: true}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "b", flow: "b", wait: true}, 1).status)
	expiring("queued")
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "a", flow: "a", wait: true}, 1).status)
	// A waiter of another class queues within the cover: its class's
	// flows (#f1) are a new key.
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "c", flow: "c", rank: 1, wait: true}, 1).status)
	expiring("a new class")
	// A flow's last waiter leaving puts the flow's finish tag back, which
	// may make its class's flows anew.
	require.NoError(t, rig.rdb.Del(ctx, qKey+"#f1").Err())
	rig.withdraw("c", 1)
	expiring("a flow's last waiter left")
	// Less than 2 TTLs left: a waiter's call covers the queue to 3.
	now := rig.serverMS()
	require.NoError(t, rig.rdb.HSet(ctx, qKey+"#v", "c", now+qTTL).Err())
	require.NoError(t, rig.rdb.PExpire(ctx, qKey+"#q", qTTL*time.Millisecond).Err())
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "a", flow: "a", wait: true}, 1).status)
	ms, err := rig.rdb.PTTL(ctx, qKey+"#q").Result()
	require.NoError(t, err)
	assert.Greater(t, ms, 2*qTTL*time.Millisecond, "the queue covered again")
	c, err := rig.rdb.HGet(ctx, qKey+"#v", "c").Float64()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, c, now+3*qTTL)
	expiring("covered again")
}

// A claim weighs its lease with the units its call sends, as a call made
// again does (the fleet's client sends a ticket's own units every time).
func TestQueueClaimWeighsItsCallsUnits(t *testing.T) {
	rig := newQueueRig(t)
	units := func() int {
		t.Helper()
		n, err := countScript.Run(context.Background(), rig.rdb, []string{qKey, qHeard}).Int()
		require.NoError(t, err)
		return n
	}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "a", units: 2}, 3).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "x", units: 2, wait: true}, 3).status)
	rig.release("a", 3)
	require.Equal(t, []string{"x"}, rig.holders())
	require.Equal(t, 2, units(), "the grant weighs the ticket's units")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x", units: 3, wait: true}, 3).status)
	assert.Equal(t, 3, units(), "the claim weighs its call's units")
}
