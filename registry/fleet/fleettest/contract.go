package fleettest

// Promises of the store contract that the fleet's client leans on but
// that a fleet of processes shows only now and then, checked on the
// store's own operations (driver.Store) as one process calls them: a
// call past its not-after time changes nothing, an abandoned lease stays
// out for as long as a call may still add it, a renewal brings back no
// lease that expired or was released, a pause holds the queues and the
// checked put-backs, a process that left is granted nothing, the queue's
// bounds are exact, a grant claimed holds for the TTL, a release removes
// only the pairs it names, and a learned state is written only over the
// version presumed and kept while it is read.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// admitCall makes c, filled in where c leaves a field zero: an hour's TTL
// and Live, a minute's claim window, process "p", one unit, a limit of 1
// on each key, and no bound on the queues (so a bound of 0 cannot be
// asked here); it fails h's test on an error, the call's own too.
func (h storeCall) admitCall(c driver.AdmitCall) driver.AdmitResult {
	h.t.Helper()
	if c.TTL == 0 {
		c.TTL = time.Hour
	}
	if c.Claim == 0 {
		c.Claim = time.Minute
	}
	if c.Live == 0 {
		c.Live = time.Hour
	}
	if c.Proc == "" {
		c.Proc = "p"
	}
	if c.Units == 0 {
		c.Units = 1
	}
	if c.Limits == nil {
		c.Limits = make([]int, len(c.Keys))
		for i := range c.Limits {
			c.Limits[i] = 1
		}
	}
	c.Weight = 1
	if c.MaxQueue == 0 {
		c.MaxQueue = -1
	}
	if c.MaxFlowQueue == 0 {
		c.MaxFlowQueue = -1
	}
	r, err := h.s.AdmitOne(context.Background(), &c)
	require.NoError(h.t, err)
	require.NoError(h.t, r.Err)
	return r
}

// renew makes c, with an hour's TTL if c leaves it zero.
func (h storeCall) renew(c driver.RenewCall) driver.RenewResult {
	h.t.Helper()
	if c.TTL == 0 {
		c.TTL = time.Hour
	}
	r, err := h.s.Renew(context.Background(), &c)
	require.NoError(h.t, err)
	return r
}

// releasePairs releases pairs, with an hour's TTL and a minute's claim
// window.
func (h storeCall) releasePairs(pairs ...driver.Release) {
	h.t.Helper()
	require.NoError(h.t, h.s.Release(context.Background(), &driver.ReleaseCall{TTL: time.Hour, Claim: time.Minute, Pairs: pairs}))
}

// An admission or a renewal made once the store's clock has passed its
// NotAfter changes nothing (driver.Store, AdmitCall step 1): it is
// refused as too late, with no epoch, on a key with room too, and neither
// admits, queues nor puts back; one before its NotAfter runs.
func notAfterChangesNothing(t *testing.T, srv Server) {
	const name = "notafter"
	h := storeCall{t, srv.Store(t, name)}
	first := h.admitCall(driver.AdmitCall{Lease: leaseID("A"), Keys: []string{"a"}})
	require.Equal(t, driver.StatusAdmitted, first.Status)
	past := first.Now - 1 // the store's clock has passed it
	for _, wait := range []bool{false, true} {
		r := h.admitCall(driver.AdmitCall{Lease: leaseID("L"), Keys: []string{"k"}, NotAfter: past, Wait: wait})
		assert.Equal(t, driver.StatusTooLate, r.Status, "an admission past its NotAfter (wait %v): %+v", wait, r)
		assert.Zero(t, r.Epoch, "a call too late tells no epoch: %+v", r)
		assert.Equal(t, 0, h.count("k"), "an admission past its NotAfter added a lease (wait %v)", wait)
		// On a full key, with Wait: not queued either.
		r = h.admitCall(driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"a"}, NotAfter: past, Wait: wait})
		assert.Equal(t, driver.StatusTooLate, r.Status, "on a full key (wait %v): %+v", wait, r)
		n, err := srv.Queued(name, "a")
		require.NoError(t, err)
		assert.Zero(t, n, "an admission past its NotAfter queued (wait %v)", wait)
	}
	r := h.renew(driver.RenewCall{NotAfter: past, Epoch: first.Epoch, Leases: []driver.Renewal{
		{Lease: leaseID("P"), Units: 1, Mode: driver.ModePutBack, Epoch: first.Epoch, Keys: []string{"k"}, Limits: []int{1}}}})
	assert.True(t, r.TooLate, "a renewal past its NotAfter: %+v", r)
	assert.Equal(t, 0, h.count("k"), "a renewal past its NotAfter put a lease back")
	// Before its NotAfter, the same calls run.
	later := first.Now + time.Hour.Milliseconds()
	r = h.renew(driver.RenewCall{NotAfter: later, Epoch: first.Epoch, Leases: []driver.Renewal{
		{Lease: leaseID("P"), Units: 1, Mode: driver.ModePutBack, Epoch: first.Epoch, Keys: []string{"k"}, Limits: []int{1}}}})
	require.False(t, r.TooLate, "%+v", r)
	assert.Equal(t, []driver.Fate{driver.FatePutBack}, r.Leases)
	assert.Equal(t, 1, h.count("k"))
	assert.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("B"), Keys: []string{"b"}, NotAfter: later}).Status)
}

// An abandoned lease stays out for the abandon's TTL and at least until
// the store's clock passes its NotAfter (driver.AbandonCall), whichever
// is later: an admission call for it is refused as abandoned, a call that
// carries it does not put it back (AdmitCall step 3), and a renewal does
// not put it back, with or without a check (RenewCall). The abandon runs
// before the admission it takes back, as a late admission would come;
// its TTL is short, its NotAfter far: the calls after the TTL still find
// it abandoned.
func abandonedStaysOut(t *testing.T, srv Server) {
	h := storeCall{t, srv.Store(t, "abandoned")}
	ctx := context.Background()
	probe := h.admitCall(driver.AdmitCall{Lease: leaseID("A"), Keys: []string{"a"}})
	require.Equal(t, driver.StatusAdmitted, probe.Status)
	x := leaseID("X")
	_, err := h.s.Abandon(ctx, []*driver.AbandonCall{{Lease: x, Keys: []string{"k"}, TTL: 50 * time.Millisecond,
		NotAfter: probe.Now + time.Hour.Milliseconds(), Claim: time.Minute}})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // past the abandon's TTL, far before its NotAfter
	r := h.admitCall(driver.AdmitCall{Lease: x, Keys: []string{"k"}, Limits: []int{5}})
	assert.Equal(t, driver.StatusAbandoned, r.Status, "an admission of a lease abandoned, before the abandon's NotAfter: %+v", r)
	assert.Equal(t, 0, h.count("k"))
	r = h.admitCall(driver.AdmitCall{Lease: leaseID("Y"), Keys: []string{"k"}, Limits: []int{5},
		Carried: []driver.Pair{{Key: "k", Lease: x, Units: 1}}})
	assert.Equal(t, driver.StatusAdmitted, r.Status, "%+v", r)
	assert.Equal(t, 1, h.count("k"), "a call put back the abandoned lease it carried")
	for _, mode := range []driver.Mode{driver.ModePutBack, driver.ModeReassert} {
		rr := h.renew(driver.RenewCall{Epoch: probe.Epoch, Leases: []driver.Renewal{
			{Lease: x, Units: 1, Mode: mode, Epoch: probe.Epoch, Keys: []string{"k"}, Limits: []int{5}}}})
		assert.Equal(t, []driver.Fate{driver.FateGone}, rr.Leases, "a renewal (mode %d) of an abandoned lease", mode)
		assert.Equal(t, 1, h.count("k"), "a renewal (mode %d) put back an abandoned lease", mode)
	}
}

// A renewal extends only a lease there and not expired (RenewCall): one
// that expired while the store was heard, or was released, is missing,
// and a renewal that reports it does not bring it back.
func renewalBringsBackNothing(t *testing.T, srv Server) {
	h := storeCall{t, srv.Store(t, "renewnothing")}
	// The first call, so that none before it was heard: a TTL of 100 ms.
	r := h.admitCall(driver.AdmitCall{Lease: leaseID("E"), Keys: []string{"e"}, TTL: 100 * time.Millisecond})
	require.Equal(t, driver.StatusAdmitted, r.Status)
	epoch := r.Epoch
	require.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("R"), Keys: []string{"r"}}).Status)
	h.releasePairs(driver.Release{Key: "r", Lease: leaseID("R"), Limit: 1})
	time.Sleep(300 * time.Millisecond) // E expires; calls of an hour's TTL find no silence
	rr := h.renew(driver.RenewCall{Epoch: epoch, Leases: []driver.Renewal{
		{Lease: leaseID("E"), Units: 1, Mode: driver.ModeReport, Epoch: epoch, Keys: []string{"e"}, Limits: []int{1}},
		{Lease: leaseID("R"), Units: 1, Mode: driver.ModeReport, Epoch: epoch, Keys: []string{"r"}, Limits: []int{1}}}})
	assert.Equal(t, []driver.Fate{driver.FateGone, driver.FateGone}, rr.Leases, "a renewal of an expired lease and of a released one")
	assert.Equal(t, 0, h.count("e"), "the expired lease came back")
	assert.Equal(t, 0, h.count("r"), "the released lease came back")
	assert.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("N"), Keys: []string{"e"}}).Status)
}

// While a pause of new admissions is honoured (a caller that saw another
// epoch declared it: AdmitCall step 2), a release serves no queue
// (ReleaseCall), a newcomer and a queued waiter are refused as paused
// (step 7), and a renewal's put-back with a check is refused while one
// without a check runs (RenewCall).
func pauseHoldsQueuesAndPutBacks(t *testing.T, srv Server) {
	const name = "pauseholds"
	h := storeCall{t, srv.Store(t, name)}
	const pause = 30 * time.Second // from the epoch's birth: far longer than the test
	held := h.admitCall(driver.AdmitCall{Lease: leaseID("H"), Keys: []string{"k"}})
	require.Equal(t, driver.StatusAdmitted, held.Status)
	epoch := held.Epoch
	require.Equal(t, driver.StatusQueued, h.admitCall(driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"k"}, Wait: true, Epoch: epoch, Pause: pause}).Status)
	r := h.admitCall(driver.AdmitCall{Lease: leaseID("N"), Keys: []string{"other"}, Epoch: epoch + 1, Pause: pause})
	require.Equal(t, driver.StatusPaused, r.Status, "a caller that saw another epoch declares a pause: %+v", r)
	require.NoError(t, h.s.Release(context.Background(), &driver.ReleaseCall{TTL: time.Hour, Pause: pause, Claim: time.Minute,
		Pairs: []driver.Release{{Key: "k", Lease: leaseID("H"), Limit: 1}}}))
	assert.Equal(t, 0, h.count("k"), "a release served the queue in a pause")
	r = h.admitCall(driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"k"}, Wait: true, Epoch: epoch, Pause: pause})
	assert.Equal(t, driver.StatusPaused, r.Status, "a queued waiter in a pause: %+v", r)
	r = h.admitCall(driver.AdmitCall{Lease: leaseID("M"), Keys: []string{"m"}, Epoch: epoch, Pause: pause})
	assert.Equal(t, driver.StatusPaused, r.Status, "a newcomer in a pause: %+v", r)
	assert.Equal(t, 0, h.count("k"))
	assert.Equal(t, 0, h.count("m"))
	rr := h.renew(driver.RenewCall{Epoch: epoch, Pause: pause, Leases: []driver.Renewal{
		{Lease: leaseID("C"), Units: 1, Mode: driver.ModeReassert, Epoch: epoch, Keys: []string{"c"}, Limits: []int{1}},
		{Lease: leaseID("P"), Units: 1, Mode: driver.ModePutBack, Epoch: epoch, Keys: []string{"p"}, Limits: []int{1}}}})
	assert.Equal(t, []driver.Fate{driver.FateGone, driver.FatePutBack}, rr.Leases, "put-backs with and without a check in a pause")
	assert.Equal(t, 0, h.count("c"), "a put-back with a check in a pause")
	assert.Equal(t, 1, h.count("p"), "a put-back without a check in a pause")
	n, err := srv.Queued(name, "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the waiter keeps its place")
}

// A process that left (Store.Leave), or whose liveness lapsed (its last
// call that queued or kept a ticket queued was longer ago than its Live),
// is granted nothing: its tickets are dropped when serving meets them,
// and the room goes to the next waiter.
func leftProcessIsNotGranted(t *testing.T, srv Server) {
	const name = "leftproc"
	h := storeCall{t, srv.Store(t, name)}
	require.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("H"), Keys: []string{"k"}}).Status)
	require.Equal(t, driver.StatusQueued, h.admitCall(driver.AdmitCall{Lease: leaseID("W1"), Keys: []string{"k"}, Wait: true, Proc: "gone"}).Status)
	require.Equal(t, driver.StatusQueued, h.admitCall(driver.AdmitCall{Lease: leaseID("W2"), Keys: []string{"k"}, Wait: true, Proc: "lapsed",
		Claim: 20 * time.Millisecond, Live: 60 * time.Millisecond}).Status)
	require.Equal(t, driver.StatusQueued, h.admitCall(driver.AdmitCall{Lease: leaseID("W3"), Keys: []string{"k"}, Wait: true, Proc: "stays"}).Status)
	require.NoError(t, h.s.Leave(context.Background(), "gone"))
	time.Sleep(300 * time.Millisecond) // W2's process is not heard of for 5 times its Live
	h.releasePairs(driver.Release{Key: "k", Lease: leaseID("H"), Limit: 1})
	assert.Equal(t, 1, h.count("k"), "the release granted nothing")
	n, err := srv.Queued(name, "k")
	require.NoError(t, err)
	assert.Zero(t, n, "the tickets of the process that left and of the one whose liveness lapsed are dropped, the next granted")
	r := h.admitCall(driver.AdmitCall{Lease: leaseID("W3"), Keys: []string{"k"}, Wait: true, Proc: "stays"})
	assert.Equal(t, driver.StatusAdmitted, r.Status, "the waiter of the process that stays, after those of processes gone: %+v", r)
	assert.Equal(t, 1, h.count("k"))
}

// A key's queue takes MaxQueue tickets and a flow's part of it
// MaxFlowQueue, no more: the next is refused (StatusQueueMax, or
// StatusFlowMax with the flow's part as Queue), naming the key.
func queueBoundsExact(t *testing.T, srv Server) {
	const name = "queuebounds"
	h := storeCall{t, srv.Store(t, name)}
	ab := []string{"a", "b"}
	require.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("H"), Keys: []string{"b"}}).Status)
	ask := func(lease, flow string) driver.AdmitResult {
		t.Helper()
		return h.admitCall(driver.AdmitCall{Lease: leaseID(lease), Keys: ab, Limits: []int{5, 1}, Wait: true, Flow: flow,
			MaxQueue: 3, MaxFlowQueue: 2})
	}
	require.Equal(t, driver.StatusQueued, ask("Q1", "f").Status)
	require.Equal(t, driver.StatusQueued, ask("Q2", "f").Status)
	r := ask("Q3", "f")
	assert.Equal(t, driver.StatusFlowMax, r.Status, "a flow's third waiter, its bound 2: %+v", r)
	assert.Equal(t, 0, r.Key, "%+v", r)
	assert.EqualValues(t, 2, r.Queue, "the flow's part: %+v", r)
	require.Equal(t, driver.StatusQueued, ask("Q4", "g").Status)
	r = ask("Q5", "h")
	assert.Equal(t, driver.StatusQueueMax, r.Status, "a fourth waiter, the queue's bound 3: %+v", r)
	assert.Equal(t, 0, r.Key, "%+v", r)
	for _, k := range ab {
		n, err := srv.Queued(name, k)
		require.NoError(t, err)
		assert.Equal(t, 3, n, "%s's queue", k)
	}
}

// A grant lasts its claim window (ReleaseCall); its waiter's call claims
// it and extends it to the TTL (AdmitCall step 6): the claimed lease is
// held long after the window.
func claimedGrantHoldsForTTL(t *testing.T, srv Server) {
	h := storeCall{t, srv.Store(t, "claimed")}
	const claim = 300 * time.Millisecond
	require.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("H"), Keys: []string{"k"}, Claim: claim}).Status)
	require.Equal(t, driver.StatusQueued, h.admitCall(driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"k"}, Wait: true, Claim: claim}).Status)
	require.NoError(t, h.s.Release(context.Background(), &driver.ReleaseCall{TTL: time.Hour, Claim: claim,
		Pairs: []driver.Release{{Key: "k", Lease: leaseID("H"), Limit: 1}}}))
	r := h.admitCall(driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"k"}, Wait: true, Claim: claim})
	require.Equal(t, driver.StatusAdmitted, r.Status, "W claims its grant: %+v", r)
	time.Sleep(5 * claim)
	assert.Equal(t, 1, h.count("k"), "the claimed grant expired at the end of its claim window")
	r = h.admitCall(driver.AdmitCall{Lease: leaseID("N"), Keys: []string{"k"}, Claim: claim})
	assert.Equal(t, driver.StatusFull, r.Status, "%+v", r)
}

// A release removes the pairs it names and no other (Store.Release): a
// lease on two keys released on one of them is still held on the other.
func releaseRemovesOnlyItsPairs(t *testing.T, srv Server) {
	h := storeCall{t, srv.Store(t, "releasepairs")}
	ab := []string{"a", "b"}
	require.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("L"), Keys: ab, Units: 2, Limits: []int{3, 3}}).Status)
	h.releasePairs(driver.Release{Key: "a", Lease: leaseID("L"), Limit: 3})
	assert.Equal(t, 0, h.count("a"))
	assert.Equal(t, 2, h.count("b"), "the release of the pair on a removed the lease from b")
	h.releasePairs(driver.Release{Key: "a", Lease: leaseID("Z"), Limit: 3}, driver.Release{Key: "b", Lease: leaseID("Z"), Limit: 3})
	assert.Equal(t, 2, h.count("b"), "a release of a lease the store does not hold removed another")
}

// A learned state is written only over the version presumed
// (LearnedCall): a write that presumes another is refused, and tells the
// store's version and state; and a state read is kept from expiring
// (LearnedResult) for another TTL while it is read within one.
func learnedCompareAndWrite(t *testing.T, srv Server) {
	s := srv.Store(t, "learnedcas")
	ctx := context.Background()
	sync := func(c driver.LearnedCall) driver.LearnedResult {
		t.Helper()
		r, err := s.SyncLearned(ctx, &c)
		require.NoError(t, err)
		return r
	}
	const ttl = 5 * time.Second
	v1, v2 := `{"k":"c","v":1,"cap":5}`, `{"k":"c","v":2,"cap":6}`
	require.True(t, sync(driver.LearnedCall{Key: "c", Presumed: "-", State: v1, TTL: ttl}).Wrote)
	r := sync(driver.LearnedCall{Key: "c", Presumed: "-", State: v2, TTL: ttl})
	assert.False(t, r.Wrote, "written over a state presumed missing: %+v", r)
	assert.Equal(t, "1", r.Version)
	assert.Equal(t, v1, r.State)
	r = sync(driver.LearnedCall{Key: "c", Presumed: "7", State: v2, TTL: ttl})
	assert.False(t, r.Wrote, "written over version 1, presuming 7: %+v", r)
	assert.Equal(t, v1, r.State)
	require.True(t, sync(driver.LearnedCall{Key: "c", Presumed: "1", State: v2, TTL: ttl}).Wrote)
	// Read at 3 s and at 6 s: found at 6, past the write's TTL, only if the
	// read at 3 kept it. A stall of up to 2 s between calls on a busy
	// machine fails nothing on a store that keeps it.
	for range 2 {
		time.Sleep(3 * ttl / 5)
		r = sync(driver.LearnedCall{Key: "c", TTL: ttl})
		require.True(t, r.Found, "a state read within its TTL expired")
		require.Equal(t, v2, r.State)
	}
}

// Leases carried by an admission call (admitted while the store could not
// be reached) are put back without a cap check, each weighing its units
// (AdmitCall step 3): over a full key, they count in full.
func carriedPutBackWithUnits(t *testing.T, srv Server) {
	h := storeCall{t, srv.Store(t, "carried")}
	require.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("H"), Keys: []string{"k"}, Units: 2, Limits: []int{2}}).Status)
	r := h.admitCall(driver.AdmitCall{Lease: leaseID("Y"), Keys: []string{"y"}, Limits: []int{4},
		Carried: []driver.Pair{{Key: "k", Lease: leaseID("C"), Units: 3}, {Key: "y", Lease: leaseID("C"), Units: 3}}})
	assert.Equal(t, driver.StatusAdmitted, r.Status, "Y, beside the 3 units carried on y: %+v", r)
	assert.Equal(t, 5, h.count("k"), "the carried lease's 3 units, put back over k's 2 held")
	assert.Equal(t, 4, h.count("y"), "the carried lease's 3 units, and Y's")
}

// An abandon with Limits serves the keys' queues as a release does
// (AbandonCall): the waiter behind the abandoned lease is granted by the
// abandon itself, before it asks again.
func abandonWithLimitsServes(t *testing.T, srv Server) {
	const name = "abandonserves"
	h := storeCall{t, srv.Store(t, name)}
	require.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("L"), Keys: []string{"k"}}).Status)
	require.Equal(t, driver.StatusQueued, h.admitCall(driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"k"}, Wait: true}).Status)
	_, err := h.s.Abandon(context.Background(), []*driver.AbandonCall{{Lease: leaseID("L"), Keys: []string{"k"}, Limits: []int{1},
		TTL: time.Hour, Claim: time.Minute}})
	require.NoError(t, err)
	assert.Equal(t, 1, h.count("k"), "the abandon granted the waiter")
	n, err := srv.Queued(name, "k")
	require.NoError(t, err)
	assert.Zero(t, n, "the waiter left the queue, granted")
	assert.Equal(t, driver.StatusAdmitted, h.admitCall(driver.AdmitCall{Lease: leaseID("W"), Keys: []string{"k"}, Wait: true}).Status)
}
