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
