package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// The grants not claimed yet, which an admission's counts leave out, are
// kept in <key>#g beside the key's leases. These tests run the store on a
// miniredis whose clock they move: what the conformance suite's
// CountsLeaveOutGrants cannot reach on a real clock.

// grantRig is a store on a miniredis for the fleet "g", whose key "k" is
// "inflight:{g}:k" in Redis.
type grantRig struct {
	t *testing.T
	m *redistest.Mini
	s driver.Store
}

func newGrantRig(t *testing.T) *grantRig {
	m := redistest.StartMini(t)
	return &grantRig{t: t, m: m, s: redisstore.New(m.Client(), "g")}
}

// admit makes lease's call on "k" under limit, and wants status.
func (g *grantRig) admit(lease string, limit int, wait bool, claim time.Duration, want driver.Status) driver.AdmitResult {
	g.t.Helper()
	res, err := g.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{limit},
		TTL: time.Hour, Wait: wait, Starts: true, Claim: claim, Live: 5 * time.Hour, Proc: "p", Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
	require.NoError(g.t, err)
	require.NoError(g.t, res.Err)
	require.Equal(g.t, want, res.Status, "%s under %d", lease, limit)
	return res
}

// release releases lease, handing its place on with a claim window of claim.
func (g *grantRig) release(lease string, limit int, claim time.Duration) {
	g.t.Helper()
	require.NoError(g.t, g.s.Release(context.Background(), &driver.ReleaseCall{Claim: claim,
		Pairs: []driver.Release{{Key: "k", Lease: lease, Limit: limit}}}))
}

// grants returns how many members <key>#g holds, live or not.
func (g *grantRig) grants() int64 {
	n, err := g.m.Client().ZCard(context.Background(), "inflight:{g}:k#g").Result()
	require.NoError(g.t, err)
	return n
}

// A grant that expired unclaimed, its ticket admitted later as a
// newcomer, is a lease held: counted (it was once left out, as its id
// stayed among the grants while another grant kept the set alive).
func TestExpiredGrantAdmittedLaterCounts(t *testing.T) {
	g := newGrantRig(t)
	g.admit("a", 2, false, time.Hour, driver.StatusAdmitted)
	g.admit("b", 2, false, time.Hour, driver.StatusAdmitted)
	g.admit("w", 2, true, time.Hour, driver.StatusQueued)
	g.admit("v", 2, true, time.Hour, driver.StatusQueued)
	g.release("a", 2, 50*time.Millisecond) // w's grant: 50 ms
	g.release("b", 2, time.Hour)           // v's: an hour
	g.m.Advance(time.Second)               // w's grant lapses unclaimed
	w := g.admit("w", 2, true, time.Hour, driver.StatusAdmitted)
	assert.Equal(t, []int64{1}, w.Counts, "w held; v's grant left out")
}

// A grant's claim window does not end another's: a grant of an hour
// beside one of 50 ms stays left out after the short one has gone.
func TestShortGrantLeavesLongOneOut(t *testing.T) {
	g := newGrantRig(t)
	g.admit("a", 2, false, time.Hour, driver.StatusAdmitted)
	g.admit("b", 2, false, time.Hour, driver.StatusAdmitted)
	g.admit("w", 2, true, time.Hour, driver.StatusQueued)
	g.admit("v", 2, true, time.Hour, driver.StatusQueued)
	g.release("a", 2, time.Hour)           // w's grant: an hour
	g.release("b", 2, 50*time.Millisecond) // v's: 50 ms
	g.m.Advance(time.Second)
	n := g.admit("n", 3, false, time.Hour, driver.StatusAdmitted)
	assert.Equal(t, []int64{1}, n.Counts, "n held; w's grant left out")
}

// Grants withdrawn before their claim, lapsed or claimed leave nothing
// behind among the grants, even while another grant keeps the set alive
// (and on a key whose admissions never ask for counts).
func TestGrantsLeaveNothingBehind(t *testing.T) {
	g := newGrantRig(t)
	ctx := context.Background()
	try := func(lease string) driver.Status {
		res, err := g.s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{2}, TTL: time.Hour,
			Claim: time.Hour, Live: 5 * time.Hour, Proc: "p", Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		require.NoError(t, res.Err)
		return res.Status
	}
	require.Equal(t, driver.StatusAdmitted, try("h0"))
	require.Equal(t, driver.StatusAdmitted, try("x"))
	g.admit("keep", 2, true, time.Hour, driver.StatusQueued)
	g.release("x", 2, time.Hour) // keep's grant, an hour long: the set lives on
	holder := "h0"
	for i := range 30 {
		w := fmt.Sprint("w", i)
		g.admit(w, 2, true, time.Hour, driver.StatusQueued)
		g.release(holder, 2, 50*time.Millisecond)
		require.Equal(t, int64(2), g.grants(), "round %d: keep's grant and %s's, nothing older", i, w)
		switch i % 3 {
		case 0: // withdrawn before its claim
			errs, err := g.s.Abandon(ctx, []*driver.AbandonCall{{Lease: w, Keys: []string{"k"}, TTL: time.Hour}})
			require.NoError(t, err)
			require.NoError(t, errs[0])
			assert.Equal(t, int64(1), g.grants(), "round %d: withdrawn", i)
		case 1: // lapsed
			g.m.Advance(100 * time.Millisecond)
		case 2: // claimed: w holds
			g.admit(w, 2, true, time.Hour, driver.StatusAdmitted)
			assert.Equal(t, int64(1), g.grants(), "round %d: claimed", i)
			holder = w
			continue
		}
		holder = fmt.Sprint("h", i+1)
		require.Equal(t, driver.StatusAdmitted, try(holder), "round %d", i)
	}
	n := g.admit("n", 3, false, time.Hour, driver.StatusAdmitted)
	assert.Equal(t, []int64{2}, n.Counts, "the holder and n; keep's grant left out")
}

// A grant under a claim window of 0 to a waiter whose liveness is 1 ms
// (the fleet's client sends at least 10 ms and 3 claim windows; a store's
// own caller may not) is made for a millisecond, and the waiter lives 3
// (driver.Millis, AdmitCall.LiveMillis): so the grant outlives the
// serving that made it, and the waiter is not taken for dead there. On a
// clock that stands still, a grant expiring at the serving's now was not
// counted, and a waiter alive until then was dropped.
func TestGrantUnderAClaimOfNoTimeCounts(t *testing.T) {
	g := newGrantRig(t)
	g.admit("a", 1, false, time.Hour, driver.StatusAdmitted)
	for _, id := range []string{"w", "x"} {
		res, err := g.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: id, Keys: []string{"k"}, Limits: []int{1},
			TTL: time.Hour, Wait: true, Live: time.Millisecond, Proc: "q", Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		require.Equal(t, driver.StatusQueued, res.Status, id)
	}
	g.release("a", 1, 0)
	n, err := g.s.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "w's grant")
	assert.Equal(t, int64(1), g.grants(), "one grant")
}

// A serving under a claim window of 0 that grants a waiter of two keys
// holds the grant on both: a waits on k and j, b behind it; both of k's
// holders go; a is granted on both keys, and b, with no room left on j,
// stays queued. (Without the millisecond, the grant made both keys' sets
// of leases anew, and covering them for 0 ms deleted them: a's grant was
// gone.)
func TestServingUnderAClaimOfNoTimeGrantsOnlyTheRoom(t *testing.T) {
	g := newGrantRig(t)
	ctx := context.Background()
	g.admit("h1", 2, false, time.Hour, driver.StatusAdmitted)
	g.admit("h2", 2, false, time.Hour, driver.StatusAdmitted)
	for _, id := range []string{"a", "b"} {
		res, err := g.s.AdmitOne(ctx, &driver.AdmitCall{Lease: id, Keys: []string{"k", "j"}, Limits: []int{2, 1},
			TTL: time.Hour, Wait: true, Claim: time.Hour, Live: 5 * time.Hour, Proc: "p", Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		require.Equal(t, driver.StatusQueued, res.Status, id)
	}
	require.NoError(t, g.s.Release(ctx, &driver.ReleaseCall{Claim: 0, Pairs: []driver.Release{{Key: "k", Lease: "h1", Limit: 2}, {Key: "k", Lease: "h2", Limit: 2}}}))
	assert.Equal(t, []string{"a"}, g.m.Leases("g", "k"), "a granted on k")
	assert.Equal(t, []string{"a"}, g.m.Leases("g", "j"), "and on j; b left queued")
}

// A learned state written for less than a millisecond is kept for one
// (driver.Millis): read back on a clock that stands still, where Redis
// refused the write ("invalid expire time").
func TestLearnedStateForUnderAMillisecond(t *testing.T) {
	g := newGrantRig(t)
	ctx := context.Background()
	w, err := g.s.SyncLearned(ctx, &driver.LearnedCall{Key: "c", Presumed: "-", State: `{"v":1}`, TTL: 500 * time.Microsecond})
	require.NoError(t, err)
	require.True(t, w.Wrote)
	r, err := g.s.SyncLearned(ctx, &driver.LearnedCall{Key: "c", TTL: 500 * time.Microsecond})
	require.NoError(t, err)
	assert.True(t, r.Found)
	assert.Equal(t, "1", r.Version)
}
