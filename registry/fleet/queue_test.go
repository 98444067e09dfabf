package fleet

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/fleettest"
)

// The queue's scripts on a real redis-server: the order they keep, the
// hand-off on release and its claim window, liveness, and the bounds.

const (
	qTTL   = 60_000 // ms
	qClaim = 2_000  // ms
)

type queueRig struct {
	t   *testing.T
	rdb *redis.Client
	q   queueKeys
}

func newQueueRig(t *testing.T) *queueRig {
	srv := fleettest.Start(t)
	rig := &queueRig{t: t, rdb: srv.Client(), q: queueKeys{key: "q{n}:k", procs: "q{n}#procs", wake: "q{n}#wake:"}}
	rig.alive("p1")
	return rig
}

func (rig *queueRig) alive(proc string) {
	require.NoError(rig.t, queueAlive(context.Background(), rig.rdb, rig.q, proc, qTTL))
}

// admit runs the admit script for tk under limit.
func (rig *queueRig) admit(tk ticket, limit int) queueReply {
	rig.t.Helper()
	if tk.proc == "" {
		tk.proc = "p1"
	}
	if tk.weight == 0 {
		tk.weight = 1
	}
	rp, err := queueAdmit(context.Background(), rig.rdb, rig.q, tk, qTTL, qClaim, limit)
	require.NoError(rig.t, err)
	return rp
}

func (rig *queueRig) leave(id string, limit int) bool {
	rig.t.Helper()
	removed, err := queueLeave(context.Background(), rig.rdb, rig.q, id, qClaim, limit)
	require.NoError(rig.t, err)
	return removed
}

// holders returns the key's lease ids, by expiry.
func (rig *queueRig) holders() []string {
	ids, err := rig.rdb.ZRange(context.Background(), rig.q.key, 0, -1).Result()
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
	require.True(rig.t, rig.leave(held, limit), "%s held a lease", held)
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
	sub := rig.rdb.Subscribe(ctx, rig.q.wake+"p1")
	defer sub.Close()
	_, err := sub.Receive(ctx) // subscribed
	require.NoError(t, err)

	assert.Equal(t, queueAdmitted, rig.admit(ticket{id: "a"}, 2).status)
	assert.Equal(t, queueAdmitted, rig.admit(ticket{id: "b"}, 2).status)
	rp := rig.admit(ticket{id: "c"}, 2)
	assert.Equal(t, queueRefused, rp.status, "full, and c does not wait")
	assert.Equal(t, 2, rp.count)
	assert.Greater(t, rp.earliest, rp.now, "the earliest expiry, for Retry-After")

	assert.Equal(t, queueWaiting, rig.admit(ticket{id: "c", wait: true}, 2).status)
	rp = rig.admit(ticket{id: "d", wait: true}, 2)
	assert.Equal(t, queueWaiting, rp.status)
	assert.Equal(t, 2, rp.queued)
	assert.Equal(t, queueWaiting, rig.admit(ticket{id: "c", wait: true}, 2).status, "asked again: still queued")
	assert.Equal(t, queueRefused, rig.admit(ticket{id: "e"}, 2).status, "a newcomer does not pass the queue")

	assert.Equal(t, "c", rig.handOff("a", 2), "the head takes the freed lease")
	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	assert.Equal(t, "c", msg.Payload, "its process is told which ticket")
	score, err := rig.rdb.ZScore(ctx, rig.q.key, "c").Result()
	require.NoError(t, err)
	rp = rig.admit(ticket{id: "c", wait: true}, 2)
	require.Equal(t, queueAdmitted, rp.status, "c claims its grant")
	claimed, err := rig.rdb.ZScore(ctx, rig.q.key, "c").Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(rp.now+qTTL), claimed, 1000, "the claim extends the lease to the TTL")
	assert.Less(t, score, claimed)
	assert.Equal(t, queueWaiting, rig.admit(ticket{id: "d", wait: true}, 2).status)
}

func TestQueueOrderClassThenArrival(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, queueAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	for _, tk := range []ticket{{id: "b1", rank: 2}, {id: "b2", rank: 2}, {id: "i1", rank: 0}, {id: "s1", rank: 1}, {id: "i2", rank: 0}} {
		tk.wait = true
		require.Equal(t, queueWaiting, rig.admit(tk, 1).status)
	}
	var order []string
	held := "x"
	for range 5 {
		held = rig.handOff(held, 1)
		require.Equal(t, queueAdmitted, rig.admit(ticket{id: held, wait: true}, 1).status)
		order = append(order, held)
	}
	assert.Equal(t, []string{"i1", "i2", "s1", "b1", "b2"}, order, "by class, then in arrival order")
}

func TestQueueFlowsShareByWeight(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, queueAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	// The heavy flow queues all its waiters first; the light one comes
	// after, with three times its weight.
	for i := range 40 {
		require.Equal(t, queueWaiting, rig.admit(ticket{id: fmt.Sprint("a", i), flow: "a", weight: 1, wait: true}, 1).status)
	}
	for i := range 40 {
		require.Equal(t, queueWaiting, rig.admit(ticket{id: fmt.Sprint("b", i), flow: "b", weight: 3, wait: true}, 1).status)
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
	require.Equal(t, queueAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.NoError(t, rig.rdb.HSet(ctx, rig.q.procs, "p2", 1).Err()) // its deadline passed long ago
	require.Equal(t, queueWaiting, rig.admit(ticket{id: "dead", proc: "p2", wait: true}, 1).status)
	require.Equal(t, queueWaiting, rig.admit(ticket{id: "live", wait: true}, 1).status)
	assert.Equal(t, "live", rig.handOff("x", 1), "the dead process's ticket is dropped, not granted")
	n, err := rig.rdb.ZCard(ctx, rig.q.key+"#q").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestQueueClaimWindow(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	require.Equal(t, queueAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.Equal(t, queueWaiting, rig.admit(ticket{id: "slow", wait: true}, 1).status)
	require.Equal(t, queueWaiting, rig.admit(ticket{id: "next", wait: true}, 1).status)
	const claim = 50 // ms
	removed, err := queueLeave(ctx, rig.rdb, rig.q, "x", claim, 1)
	require.NoError(t, err)
	require.True(t, removed)
	assert.Equal(t, []string{"slow"}, rig.holders(), "granted for the claim window")
	// slow never claims: once the window has passed, the next script call
	// (here next's own, as it polls) hands the lease on.
	var rp queueReply
	require.Eventually(t, func() bool {
		rp, err = queueAdmit(ctx, rig.rdb, rig.q, ticket{id: "next", proc: "p1", weight: 1, wait: true}, qTTL, qClaim, 1)
		return err == nil && rp.status != queueWaiting
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, queueAdmitted, rp.status, "next is served and claims in one call")
	assert.Equal(t, []string{"next"}, rig.holders())
}

func TestQueueBounds(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, queueAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	tk := func(id, flow string) ticket {
		return ticket{id: id, flow: flow, wait: true, maxQ: 3, maxFlow: 2}
	}
	assert.Equal(t, queueWaiting, rig.admit(tk("a1", "a"), 1).status)
	assert.Equal(t, queueWaiting, rig.admit(tk("a2", "a"), 1).status)
	assert.Equal(t, queueFlowFull, rig.admit(tk("a3", "a"), 1).status, "flow a has 2 queued")
	assert.Equal(t, queueWaiting, rig.admit(tk("b1", "b"), 1).status)
	rp := rig.admit(tk("c1", "c"), 1)
	assert.Equal(t, queueFull, rp.status, "3 queued")
	assert.Equal(t, 3, rp.queued)

	assert.False(t, rig.leave("a1", 1), "a queued ticket leaves without a lease")
	assert.Equal(t, queueWaiting, rig.admit(tk("a3", "a"), 1).status, "flow a has room again")
}

func TestQueueRefusesABadWeight(t *testing.T) {
	for _, w := range []float64{0, -1, math.NaN(), math.Inf(1)} {
		_, err := queueAdmit(context.Background(), nil, queueKeys{}, ticket{id: "a", weight: w}, qTTL, qClaim, 1)
		assert.ErrorIs(t, err, errQueueWeight, "weight %v", w)
	}
}

func TestQueueLeaveGrantedHandsOn(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, queueAdmitted, rig.admit(ticket{id: "x"}, 1).status)
	require.Equal(t, queueWaiting, rig.admit(ticket{id: "w1", wait: true}, 1).status)
	require.Equal(t, queueWaiting, rig.admit(ticket{id: "w2", wait: true}, 1).status)
	require.Equal(t, "w1", rig.handOff("x", 1))
	// w1's caller gave up before it claimed: its grant goes to w2.
	assert.Equal(t, "w2", rig.handOff("w1", 1))
	assert.Equal(t, queueAdmitted, rig.admit(ticket{id: "w2", wait: true}, 1).status)
	// The queue is empty: its keys are gone, tags start anew.
	n, err := rig.rdb.Exists(context.Background(), rig.q.key+"#q", rig.q.key+"#t", rig.q.key+"#v").Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}
