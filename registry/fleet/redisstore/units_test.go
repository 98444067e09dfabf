package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// Weighted leases (units.go): a key's count is its ZCARD plus the #extra
// of its hash <key>#w, which every way out of the sorted set must keep
// exact.

// unitsRig is a store of the fleet "u" on a Redis whose raw keys the test
// reads: its key "k" is "inflight:{u}:k", its units "inflight:{u}:k#w".
type unitsRig struct {
	t   *testing.T
	rdb redis.UniversalClient
	s   driver.Store
}

const (
	uKey     = "inflight:{u}:k"
	uWeights = uKey + "#w"
)

// admit makes lease's call on "k" for units under limit, with a TTL and a
// claim window, and wants status; it returns the epoch.
func (u *unitsRig) admit(lease string, units, limit int, ttl time.Duration, wait bool, claim time.Duration, want driver.Status) int64 {
	u.t.Helper()
	res, err := u.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{limit}, Units: units,
		TTL: ttl, Wait: wait, Claim: claim, Live: 5 * time.Hour, Proc: "p", Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
	require.NoError(u.t, err)
	require.NoError(u.t, res.Err)
	require.Equal(u.t, want, res.Status, "%s: %d units under %d", lease, units, limit)
	return res.Epoch
}

func (u *unitsRig) release(lease string, limit int, claim time.Duration) {
	u.t.Helper()
	require.NoError(u.t, u.s.Release(context.Background(), &driver.ReleaseCall{Claim: claim,
		Pairs: []driver.Release{{Key: "k", Lease: lease, Limit: limit}}}))
}

func (u *unitsRig) renew(lease string, units int, mode driver.Mode, epoch int64, limit int) driver.Fate {
	u.t.Helper()
	res, err := u.s.Renew(context.Background(), &driver.RenewCall{TTL: time.Hour, Epoch: epoch, Leases: []driver.Renewal{
		{Lease: lease, Units: units, Mode: mode, Epoch: epoch, Keys: []string{"k"}, Limits: []int{limit}}}})
	require.NoError(u.t, err)
	require.Len(u.t, res.Leases, 1)
	return res.Leases[0]
}

func (u *unitsRig) count() int {
	u.t.Helper()
	n, err := u.s.Count(context.Background(), "k")
	require.NoError(u.t, err)
	return n
}

// exact checks the raw keys: the hash holds the weighted leases want
// (lease: units) and nothing else, each a member of the key's sorted set,
// its #extra their units less one each, and it expires with the key; with
// none, there is no hash. The store counts count.
func (u *unitsRig) exact(want map[string]int, count int, what string) {
	u.t.Helper()
	ctx := context.Background()
	h, err := u.rdb.HGetAll(ctx, uWeights).Result()
	require.NoError(u.t, err)
	if len(want) == 0 {
		assert.Empty(u.t, h, "%s: no weighted lease, no hash", what)
	} else {
		extra := 0
		got := map[string]int{}
		for f, v := range h {
			n, err := strconv.Atoi(v)
			require.NoError(u.t, err, "%s: field %s", what, f)
			if f == "#extra" {
				extra = n
				continue
			}
			got[f] = n
			_, err = u.rdb.ZScore(ctx, uKey, f).Result()
			assert.NoError(u.t, err, "%s: %s's units without its lease", what, f)
		}
		assert.Equal(u.t, want, got, "%s: the weighted leases", what)
		sum := 0
		for _, n := range want {
			sum += n - 1
		}
		assert.Equal(u.t, sum, extra, "%s: #extra", what)
		kt, err := u.rdb.PTTL(ctx, uKey).Result()
		require.NoError(u.t, err)
		wt, err := u.rdb.PTTL(ctx, uWeights).Result()
		require.NoError(u.t, err)
		assert.InDelta(u.t, kt.Milliseconds(), wt.Milliseconds(), 2, "%s: the hash expires with its key", what)
	}
	assert.Equal(u.t, count, u.count(), "%s: the count in units", what)
}

// The extra units stay exact on every way a lease leaves the key: expiry,
// a renewal that finds it expired (and one that puts it back), an
// abandon, a grant given back, a grant that lapses unclaimed, a release.
func TestUnitsSumStaysExact(t *testing.T) {
	m := redistest.StartMini(t)
	u := &unitsRig{t: t, rdb: m.Client(), s: New(m.Client(), "u")}
	const hour = time.Hour
	epoch := u.admit("a", 3, 20, time.Second, false, hour, driver.StatusAdmitted)
	u.admit("b", 1, 20, hour, false, hour, driver.StatusAdmitted)
	u.admit("c", 5, 20, hour, false, hour, driver.StatusAdmitted)
	u.exact(map[string]int{"a": 3, "c": 5}, 9, "a 3, b 1, c 5")

	m.Advance(2 * time.Second) // a expires
	assert.Equal(t, 6, u.count(), "a expired: not counted, though not dropped yet")
	u.admit("d", 2, 20, hour, false, hour, driver.StatusAdmitted)
	u.exact(map[string]int{"c": 5, "d": 2}, 8, "a dropped expired; d 2")

	u.admit("e", 4, 20, time.Second, false, hour, driver.StatusAdmitted)
	u.exact(map[string]int{"c": 5, "d": 2, "e": 4}, 12, "e 4")
	m.Advance(2 * time.Second) // e expires
	assert.Equal(t, driver.FateGone, u.renew("e", 4, driver.ModeReport, epoch, 20))
	u.exact(map[string]int{"c": 5, "d": 2}, 8, "e found expired by a renewal")
	assert.Equal(t, driver.FateGone, u.renew("e", 4, driver.ModeReassert, epoch, 11), "8 + 4 is over 11")
	assert.Equal(t, driver.FateRoom, u.renew("e", 4, driver.ModeReassert, epoch, 12), "8 + 4 fits 12")
	u.exact(map[string]int{"c": 5, "d": 2, "e": 4}, 12, "e put back")
	assert.Equal(t, driver.FateRenewed, u.renew("e", 4, driver.ModeReassert, epoch, 12))
	u.exact(map[string]int{"c": 5, "d": 2, "e": 4}, 12, "e renewed")

	errs, err := u.s.Abandon(context.Background(), []*driver.AbandonCall{{Lease: "c", Keys: []string{"k"}, TTL: hour}})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	u.exact(map[string]int{"d": 2, "e": 4}, 7, "c abandoned")

	// Under a limit of 8: w (3) waits; d's release grants it; its claim
	// under a limit lowered to 7 gives the grant back, and it waits again.
	u.admit("w", 3, 8, hour, true, hour, driver.StatusQueued)
	w, err := u.rdb.HGet(context.Background(), uKey+"#t", "w|w").Result()
	require.NoError(t, err)
	assert.Equal(t, "3", w, "the ticket keeps its units")
	u.release("d", 8, hour)
	u.exact(map[string]int{"e": 4, "w": 3}, 8, "w granted")
	u.admit("w", 3, 7, hour, true, hour, driver.StatusQueued)
	u.exact(map[string]int{"e": 4}, 5, "w's grant given back")

	// e's release grants w for 50 ms, which lapse unclaimed.
	u.release("e", 8, 50*time.Millisecond)
	u.exact(map[string]int{"w": 3}, 4, "w granted again")
	m.Advance(time.Second)
	assert.Equal(t, 1, u.count(), "w's grant lapsed")
	u.admit("f", 1, 8, hour, false, hour, driver.StatusAdmitted)
	u.exact(nil, 2, "w's lapsed grant dropped")

	u.admit("g", 6, 8, hour, false, hour, driver.StatusAdmitted)
	u.exact(map[string]int{"g": 6}, 8, "g 6")
	u.release("g", 8, hour)
	u.exact(nil, 2, "g released")
	u.release("b", 8, hour)
	u.release("f", 8, hour)
	u.exact(nil, 0, "all released")
	n, err := u.rdb.Exists(context.Background(), uKey, uWeights, uKey+"#q", uKey+"#t").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left of the key")
}

// A lease carried (admitted while Redis was unreachable) is put back with
// its units, once however often it is carried; and a hash left beside a
// key that has emptied (as a script of an older release may leave one) is
// not counted.
func TestUnitsCarriedAndStaleHash(t *testing.T) {
	m := redistest.StartMini(t)
	u := &unitsRig{t: t, rdb: m.Client(), s: New(m.Client(), "u")}
	ctx := context.Background()
	for range 2 {
		res, err := u.s.AdmitOne(ctx, &driver.AdmitCall{Lease: "n", Keys: []string{"k"}, Limits: []int{10}, Units: 2, TTL: time.Hour,
			Claim: time.Hour, Live: time.Hour, Proc: "p", Weight: 1, MaxQueue: -1, MaxFlowQueue: -1,
			Carried: []driver.Pair{{Key: "k", Lease: "carried", Units: 4}}})
		require.NoError(t, err)
		require.Equal(t, driver.StatusAdmitted, res.Status)
	}
	u.exact(map[string]int{"n": 2, "carried": 4}, 6, "carried with its units")
	u.release("n", 10, time.Hour)
	u.release("carried", 10, time.Hour)
	u.exact(nil, 0, "released")

	require.NoError(t, u.rdb.HSet(ctx, uWeights, "gone", 5, "#extra", 4).Err())
	u.admit("x", 1, 2, time.Hour, false, time.Hour, driver.StatusAdmitted)
	u.exact(nil, 1, "the stale hash is dropped, not counted")
}

// Processes that mix weighted and unweighted leases on two keys, waiting,
// giving up and releasing at once, leave each key at a count of 0, and
// nothing of them in Redis.
func TestUnitsMixEndsAtZero(t *testing.T) {
	srv := redistest.Start(t)
	rs := make([]*fleet.Registry[string], 3)
	for i := range rs {
		rs[i] = fleet.New[string](New(srv.ClientFor(t), "mix"), 6)
		t.Cleanup(rs[i].Close)
	}
	var wg sync.WaitGroup
	for i := range 120 {
		r, n := rs[i%3], 1+rand.IntN(4)
		wg.Go(func() {
			timeout := time.Second
			if i%5 == 0 {
				timeout = time.Millisecond // gives up: its ticket or grant is abandoned
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			var err error
			var release func()
			switch i % 4 {
			case 0:
				s, e := r.Acquire(ctx, "a")
				err, release = e, func() { s.Release() }
			case 1:
				s, e := r.AcquireN(ctx, "a", n)
				err, release = e, func() { s.Release() }
			case 2:
				s, e := r.AcquireAllN(ctx, n, "a", "b")
				err, release = e, func() { s.Release() }
			default:
				s, e := r.TryAcquireN("b", n)
				err, release = e, func() { s.Release() }
			}
			if err != nil {
				return
			}
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
			release()
		})
	}
	wg.Wait()
	ctx := context.Background()
	c := srv.Client()
	for _, k := range []string{"a", "b"} {
		require.Eventually(t, func() bool {
			n, err := rs[0].InFlight(ctx, k)
			return err == nil && n == 0
		}, 10*time.Second, 5*time.Millisecond, "%s: every unit released", k)
		key := "inflight:{mix}:" + k
		require.Eventually(t, func() bool {
			n, err := c.Exists(ctx, key, key+"#w").Result()
			return err == nil && n == 0
		}, 10*time.Second, 5*time.Millisecond, "%s: its leases and units are gone", k)
	}
}

// The scripts on a real server (the queue's rig): a heavy waiter lets a
// waiting newcomer of one key take the room it cannot use, counted
// against it (a newcomer that does not wait takes none), up to its bound;
// then it keeps the room from the lighter waiters behind it and from
// newcomers, and the replies count units.
func TestQueueHeavyWaiterKeepsTheRoom(t *testing.T) {
	rig := newQueueRig(t)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x", units: 3}, 4).status)
	rp := rig.admit(ticket{id: "H", units: 4, wait: true}, 4)
	require.Equal(t, acquireQueued, rp.status)
	assert.Equal(t, 3, rp.count, "the count in units")
	rp = rig.admit(ticket{id: "n"}, 4)
	assert.Equal(t, acquireFull, rp.status, "a newcomer that does not wait does not pass H")
	assert.Equal(t, 3, rp.count)
	for i := range 4 * driver.PassFactor {
		id := fmt.Sprint("L", i)
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: id, wait: true}, 4).status, "a waiting newcomer passes H")
		rig.release(id, 4)
	}
	passed, err := rig.rdb.HGet(context.Background(), qKey+"#t", "u|H").Int()
	require.NoError(t, err)
	assert.Equal(t, 4*driver.PassFactor, passed, "its bound")
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "L", wait: true}, 4).status, "past it, behind H")
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "L", wait: true}, 4).status, "nor does L")
	assert.Equal(t, "H", rig.handOff("x", 4))
	assert.Equal(t, []string{"H"}, rig.holders(), "L waits for H's units")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "H", units: 4, wait: true}, 4).status)
}

// A waiter passed over for want of room on its other key, or whose units
// are over the serving call's limit, keeps no room: the waiters behind it
// are served.
func TestQueueWaitersPassedOverAreNotHeavy(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x", units: 4}, 6).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xb", keys: []string{b}}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "M", units: 3, keys: []string{a, b}, limits: []int{6, 1}, wait: true}, 0).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "O", units: 5, wait: true}, 6).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "L", units: 2, wait: true}, 6).status)
	// x's release under a limit of 4: M has no room on b, O's 5 units are
	// over 4; L's 2 fit.
	assert.Equal(t, "L", rig.handOff("x", 4))
}

// Serving that stops at its bound, short of a heavy waiter, looks further
// for a newcomer: a waiting newcomer passes the heavy waiter there,
// counted against it, up to its bound; then neither a newcomer nor a
// lighter waiter behind it takes its room, and the heavy waiter takes it
// on its own call once it is free.
func TestQueueHeavyWaiterBeyondTheScan(t *testing.T) {
	rig := newQueueRig(t)
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "ha", units: 3}, 4).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "hb", keys: []string{b}}, 1).status)
	for i := range 64 { // more than serve looks at, all waiting for b
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("x", i), keys: []string{a, b}, limits: []int{4, 1}, wait: true}, 0).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "H", units: 2, wait: true}, 4).status)
	for i := range 2 * driver.PassFactor {
		id := fmt.Sprint("P", i)
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: id, wait: true}, 4).status, "pass %d", i+1)
		rig.release(id, 4)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "L", wait: true}, 4).status, "past its bound")
	assert.Equal(t, acquireQueued, rig.admit(ticket{id: "L", wait: true}, 4).status, "a unit is free, kept for H")
	assert.Equal(t, acquireFull, rig.admit(ticket{id: "N"}, 4).status, "nor a newcomer's")
	rig.release("ha", 4)
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "H", units: 2, wait: true}, 4).status)
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "L", wait: true}, 4).status)
}

// The place a key keeps for its oldest urgent ticket is as many units as
// that ticket weighs.
func TestQueueKeptPlaceWeighsItsTicket(t *testing.T) {
	rig := newQueueRig(t)
	ctx := context.Background()
	const a, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xb", keys: []string{b}}, 1).status) // b full
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x0", units: 3}, 6).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x1", units: 3}, 6).status) // a full
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "M", units: 2, keys: []string{a, b}, limits: []int{6, 1}, wait: true}, 0).status)
	arrival, err := rig.rdb.HGet(ctx, a+"#t", "a|M").Float64()
	require.NoError(t, err)
	require.NoError(t, rig.rdb.ZAdd(ctx, a+"#u", redis.Z{Score: arrival, Member: "M"}).Err()) // as MaxPassed pass-overs would
	rig.release("x0", 6)
	// 3 units free on a, 2 kept for M: a newcomer takes the third.
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "n1"}, 6).status)
	assert.Equal(t, acquireFull, rig.admit(ticket{id: "n2"}, 6).status)
}

// A waiter of several keys is not granted as one of its keys is served
// while a heavy waiter stands before it on another, by that waiter's own
// limit there: here a waiter of one key, whose calls keep its limit.
func TestQueueWaiterBehindAHeavyOneOnItsOtherKey(t *testing.T) {
	rig := newQueueRig(t)
	const tokens, b = qKey, "q{n}:b"
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x", units: 6}, 10).status)
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xb", keys: []string{b}}, 3).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "H", units: 8, wait: true}, 10).status)
	L := ticket{id: "L", units: 3, keys: []string{tokens, b}, limits: []int{10, 3}, wait: true}
	require.Equal(t, acquireQueued, rig.admit(L, 0).status)
	rig.releaseFrom("xb", []string{b}, []int{3}, qClaim)
	assert.Empty(t, rig.holdersOf(b), "L fits both keys, but stands behind H on tokens")
	assert.Equal(t, acquireQueued, rig.admit(L, 0).status, "nor does its own call take the room")
	assert.Equal(t, "H", rig.handOff("x", 10))
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "H", units: 8, wait: true}, 10).status)
	assert.Equal(t, acquireQueued, rig.admit(L, 0).status, "8 + 3 is over 10")
	rig.release("H", 10)
	assert.Equal(t, acquireAdmitted, rig.admit(L, 0).status)
}

// A heavy waiter of a dead process is dropped as serving meets it, under
// its bound of units passed too: it keeps no room, not even from a
// newcomer that does not wait.
func TestQueueDeadHeavyWaiterKeepsNoRoom(t *testing.T) {
	rig := newQueueRig(t)
	rig.alive("p2")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x", units: 3}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "H", proc: "p2", units: 4, wait: true}, 4).status)
	require.NoError(t, rig.rdb.HSet(context.Background(), qProcs, "p2", 1).Err()) // its deadline long past
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "n"}, 4).status)
}

// Dead processes' heavy waiters behind a live one are dropped as serving
// meets them, not looked past: a light waiter behind 64 of them, beyond
// serving's 64 places while they live, is served on its own call once
// they are dead.
func TestQueueDeadHeavyWaitersBehindABlockerAreDropped(t *testing.T) {
	rig := newQueueRig(t)
	rig.alive("p2")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "x", units: 3}, 4).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "B", units: 4, wait: true}, 4).status)
	for i := range 64 {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("d", i), proc: "p2", units: 2, wait: true}, 4).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "L", wait: true}, 4).status, "beyond the 64 places")
	require.NoError(t, rig.rdb.HSet(context.Background(), qProcs, "p2", 1).Err()) // their deadline long past
	assert.Equal(t, acquireAdmitted, rig.admit(ticket{id: "L", wait: true}, 4).status, "L passes B; the dead ones are gone")
	assert.ElementsMatch(t, []string{"L", "x"}, rig.holders())
}

// A release of several leases serves each key's queue once, with all the
// units it freed: a heavy waiter at the head is granted them, where
// serving after each lease would have let a light waiter behind it take
// the first unit. The lowest limit the batch names for a key binds.
func TestQueueBatchReleaseServesOnceWithAllItsRoom(t *testing.T) {
	rig := newQueueRig(t)
	for _, id := range []string{"a", "b", "c"} {
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: id}, 3).status)
	}
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "H", units: 3, wait: true}, 3).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "L", wait: true}, 3).status)
	rig.releaseBatch([]string{"a", "b", "c"}, []int{3, 3, 3})
	assert.Equal(t, []string{"H"}, rig.holders(), "H takes the three units freed together")

	rig.releaseBatch([]string{"H"}, []int{3})
	require.Equal(t, []string{"L"}, rig.holders())
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "L", wait: true}, 3).status)
	for _, id := range []string{"d", "e"} {
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: id}, 3).status)
	}
	for _, id := range []string{"M", "N"} {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: id, wait: true}, 3).status)
	}
	rig.releaseBatch([]string{"L", "d"}, []int{2, 3})
	assert.ElementsMatch(t, []string{"e", "M"}, rig.holders(), "under the lower limit, 2, one unit is free")
}

// A release of many leases on one key, whose serving stops at its bound
// on the waiters it looks at (dead processes' tickets dropped at the head,
// then grants), goes on from there: every unit it freed goes to a live
// waiter, as when each lease was released alone.
func TestQueueBatchReleaseGoesOnPastServingsBound(t *testing.T) {
	rig := newQueueRig(t)
	rig.alive("p2")
	const n = 150 // 150 dropped and 150 granted: past 4 × PassScan looks
	var ids, live []string
	var limits []int
	for i := range n {
		ids, limits = append(ids, fmt.Sprint("h", i)), append(limits, n)
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: ids[i]}, n).status)
	}
	for i := range n {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: fmt.Sprint("d", i), proc: "p2", wait: true}, n).status)
	}
	for i := range n {
		live = append(live, fmt.Sprint("w", i))
		require.Equal(t, acquireQueued, rig.admit(ticket{id: live[i], wait: true}, n).status)
	}
	require.NoError(t, rig.rdb.HSet(context.Background(), qProcs, "p2", 1).Err()) // their deadline long past
	rig.releaseBatch(ids, limits)
	assert.ElementsMatch(t, live, rig.holders(), "every unit freed granted to a live waiter")
}

// releaseBatch frees the leases ids on qKey, under the limits, in one call.
func (rig *queueRig) releaseBatch(ids []string, limits []int) {
	rig.t.Helper()
	keys := []string{"q{n}#pause", qProcs}
	args := []any{qClaim, qWake}
	for i, id := range ids {
		keys = append(keys, qKey)
		args = append(args, id, limits[i])
	}
	require.NoError(rig.t, releaseScript.Run(context.Background(), rig.rdb, append(keys, qHeard), append(args, qTTL, 0)...).Err())
}

// Serving keeps its window of waiters across a grant and goes on from
// the next one: a waiter of two keys passed over for want of room on its
// other key counts one pass per grant made past it, not two.
func TestQueueKeptWindowCountsEachGrantOnce(t *testing.T) {
	rig := newQueueRig(t)
	const b = "q{n}:b"
	for _, id := range []string{"h1", "h2", "h3"} {
		require.Equal(t, acquireAdmitted, rig.admit(ticket{id: id}, 3).status)
	}
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "xb", keys: []string{b}}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "m", keys: []string{qKey, b}, limits: []int{3, 1}, wait: true}, 0).status)
	for _, id := range []string{"s0", "s1"} {
		require.Equal(t, acquireQueued, rig.admit(ticket{id: id, wait: true}, 3).status)
	}
	rig.releaseBatch([]string{"h1", "h2"}, []int{3, 3})
	assert.ElementsMatch(t, []string{"h3", "s0", "s1"}, rig.holders())
	p, err := rig.rdb.HGet(context.Background(), qKey+"#t", "p|m").Int()
	require.NoError(t, err)
	assert.Equal(t, 2, p, "m passed over once per grant")
}

// Serving stops once a grant fills the key: a dead process's ticket
// behind the waiter granted is not reached (nor dropped) by that serving.
func TestQueueServingStopsWhenAGrantFillsTheKey(t *testing.T) {
	rig := newQueueRig(t)
	rig.alive("p2")
	require.Equal(t, acquireAdmitted, rig.admit(ticket{id: "h"}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "w", wait: true}, 1).status)
	require.Equal(t, acquireQueued, rig.admit(ticket{id: "d", proc: "p2", wait: true}, 1).status)
	require.NoError(t, rig.rdb.HSet(context.Background(), qProcs, "p2", 1).Err()) // its deadline long past
	assert.Equal(t, "w", rig.handOff("h", 1))
	n, err := rig.rdb.ZCard(context.Background(), qKey+"#q").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "d still queued: serving stopped at the full key")
}
