package fleettest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/slots"
)

// Weighted leases: a key's count is the sum of its leases' units.

// Three processes, a cap of 10 units, 90 waiters of 1 to 4 units each: the
// units held at once never pass 10 (an independent counter), every waiter
// is admitted, and the store counts nothing once all are released.
func unitsCap(t *testing.T, srv Server) {
	rs := processes(t, srv, "units", 3, 10, fleet.WithTimeout(slowCalls))
	var active, peak, admitted atomic.Int32
	var wg sync.WaitGroup
	for i := range 90 {
		r, n := rs[i%3], 1+rand.IntN(4)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 6*wait)
			defer cancel()
			s, err := r.AcquireN(ctx, "k", n)
			if !assert.NoError(t, err) {
				return
			}
			assert.Equal(t, n, s.Units())
			now := active.Add(int32(n))
			raise(&peak, now)
			admitted.Add(1)
			time.Sleep(2 * time.Millisecond) // the held request's work
			active.Add(-int32(n))
			s.Release()
		})
	}
	wg.Wait()
	assert.Equal(t, int32(90), admitted.Load())
	assert.LessOrEqual(t, peak.Load(), int32(10), "units held at once")
	t.Logf("at most %d units held at once, of 10", peak.Load())
	for _, r := range rs {
		st := r.Stats()
		assert.Zero(t, st.Degraded, "admitted by the store, not locally")
		assert.Zero(t, st.StoreErrors, "store errors")
	}
	inFlightIs(t, rs[0], "k", 0, "every unit released")
}

// A key counts units: TryAcquireN takes what fits and no more, InFlight and
// a refusal tell units, and a release frees exactly the units taken, on
// every key of an AcquireAllN.
func unitsCounted(t *testing.T, srv Server) {
	rs := processes(t, srv, "counted", 2, 10)
	a, b := rs[0], rs[1]
	a.SetLimit("small", 5)
	b.SetLimit("small", 5)
	s7, err := a.TryAcquireN("k", 7)
	require.NoError(t, err)
	_, err = b.TryAcquireN("k", 4)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le, "7 + 4 units under a cap of 10")
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, 7, le.InFlight, "the refusal tells units")
	s3, err := b.TryAcquireN("k", 3)
	require.NoError(t, err, "7 + 3 fits")
	inFlightIs(t, b, "k", 10, "10 units held")
	s7.Release()
	inFlightIs(t, b, "k", 3, "the release frees its 7 units")

	all, err := a.TryAcquireAllN(4, "k", "small")
	require.NoError(t, err)
	assert.Equal(t, 4, all.Units())
	inFlightIs(t, b, "small", 4, "4 units on each key")
	inFlightIs(t, b, "k", 7, "4 units on each key")
	_, err = b.TryAcquireAllN(2, "k", "small")
	require.ErrorIs(t, err, slots.ErrLimitReached, "4 + 2 units over small's 5")
	n, err := b.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 7, n, "a refusal on one key takes nothing on the other")
	all.Release()
	s3.Release()
	inFlightIs(t, b, "small", 0, "released")
	inFlightIs(t, b, "k", 0, "released")
}

// A waiter of 4 units at the head of a key with 1 free is passed by
// lighter callers that wait, never by a TryAcquire, until they have taken
// its bound (driver.PassFactor times its units, in its flow); then it
// keeps that unit from a lighter newcomer and from a lighter waiter behind
// it, and is admitted first once its units are free.
func heavyWaiterFirst(t *testing.T, srv Server) {
	rs := patientProcesses(t, srv, "heavy", 3, 4, fleet.WithTimeout(slowCalls))
	holder, heavy, light := rs[0], rs[1], rs[2]
	held, err := holder.TryAcquireN("k", 3)
	require.NoError(t, err)
	adm := newAdmissions(t)
	adm.waitN(heavy, "heavy", 4)
	queuedIs(t, srv, "heavy", "k", 1)
	_, err = light.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached, "a TryAcquire does not pass a waiter")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for i := range 4 * driver.PassFactor {
		s, err := light.Acquire(ctx, "k")
		require.NoError(t, err, "pass %d: 1 unit is free", i+1)
		s.Release()
	}
	inFlightIs(t, light, "k", 3, "the passes' units given back")
	adm.waitN(light, "light", 1)
	queuedIs(t, srv, "heavy", "k", 2)
	n, err := light.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 3, n, "past its bound, the free unit is kept for the heavy waiter")
	held.Release()
	assert.Equal(t, []string{"heavy", "light"}, adm.done(t))
}

// Waiters of another flow, or of another class in the same flow, pass a
// heavy waiter by half its units (driver.Pass): behind a waiter of 4
// units on a key with 1 free, two callers of one unit pass it, and the
// third waits until it is served.
func heavyWaiterPassedByOtherFlows(t *testing.T, srv Server) {
	for name, place := range map[string]func(context.Context) context.Context{
		"flow":  func(ctx context.Context) context.Context { return slots.WithFlow(ctx, "other") },
		"class": func(ctx context.Context) context.Context { return slots.WithPriority(ctx, slots.PriorityBatch) },
	} {
		t.Run(name, func(t *testing.T) {
			rs := patientProcesses(t, srv, "heavy"+name, 3, 4, fleet.WithTimeout(slowCalls))
			holder, heavy, light := rs[0], rs[1], rs[2]
			held, err := holder.TryAcquireN("k", 3)
			require.NoError(t, err)
			adm := newAdmissions(t)
			adm.waitN(heavy, "heavy", 4)
			queuedIs(t, srv, "heavy"+name, "k", 1)
			ctx, cancel := context.WithTimeout(place(context.Background()), wait)
			defer cancel()
			for i := range 4 / 2 {
				s, err := light.Acquire(ctx, "k")
				require.NoError(t, err, "pass %d of 2", i+1)
				s.Release()
			}
			inFlightIs(t, light, "k", 3, "the passes' units given back")
			adm.waitPlaced(place, light, "light", 1, "k")
			queuedIs(t, srv, "heavy"+name, "k", 2)
			held.Release()
			assert.Equal(t, []string{"heavy", "light"}, adm.done(t))
		})
	}
}

// The same for waiters of several keys, as a provider's requests take its
// tokens and their model's: a light waiter on {tokens, b} behind a heavy
// one on {tokens, a} is not granted tokens' room when b's queue is served
// (a release on b), and is admitted after the heavy one (the two do not
// fit together).
func heavyWaiterFirstOnSeveralKeys(t *testing.T, srv Server) {
	// Its grants wait for their claims: a grant the heavy waiter claimed
	// late (a busy machine) would go to the light waiter, as the protocol
	// says.
	rs := patientProcesses(t, srv, "heavyall", 3, 10, fleet.WithTimeout(slowCalls))
	holder, heavy, light := rs[0], rs[1], rs[2]
	for _, r := range rs {
		r.SetLimit("b", 3)
	}
	held, err := holder.TryAcquireN("tokens", 6)
	require.NoError(t, err)
	onB, err := holder.TryAcquire("b") // b full for 3 more
	require.NoError(t, err)
	adm := newAdmissions(t)
	adm.waitAll(heavy, "heavy", 8, "tokens", "a")
	queuedIs(t, srv, "heavyall", "tokens", 1)
	adm.waitAll(light, "light", 3, "tokens", "b")
	queuedIs(t, srv, "heavyall", "tokens", 2)
	onB.Release() // serves b's queue: its light waiter fits tokens (6 + 3), but stands behind the heavy one
	inFlightIs(t, light, "b", 0, "the release on b reached the store")
	n, err := light.InFlight(context.Background(), "tokens")
	require.NoError(t, err)
	assert.Equal(t, 6, n, "tokens' room kept for the heavy waiter")
	_, err = light.TryAcquireAllN(2, "tokens", "c")
	require.ErrorIs(t, err, slots.ErrLimitReached, "nor taken by a newcomer")
	held.Release()
	assert.Equal(t, []string{"heavy", "light"}, adm.done(t))
}

// A heavy waiter of 600,000,000 units on a key whose limit is
// slots.MaxUnits, held by 1,600,000,000: its bound, PassFactor times its
// units, and the 2*PassFactor times their units that waiters of another
// flow count against it are past what 32 bits hold. A caller of its flow
// passes it, a release serves the key past it, one of another flow takes
// it to its bound, and then it keeps the room from a newcomer; once the
// holder releases it is granted, and the newcomer behind it.
func heavyWaiterOfManyUnits(t *testing.T, srv Server) {
	h := storeCall{t, srv.Store(t, "heavyWaiterOfManyUnits")}
	const lim = slots.MaxUnits
	require.Equal(t, driver.StatusAdmitted, h.admit("H", "k", 1_600_000_000, lim, 0, "f0", false).Status)
	require.Equal(t, driver.StatusQueued, h.admit("B", "k", 600_000_000, lim, 0, "f0", true).Status)
	require.Equal(t, driver.StatusAdmitted, h.admit("P", "k", 300_000_000, lim, 0, "f0", true).Status,
		"a caller of its flow passes it (300,000,000 of its bound)")
	h.release("P", "k", lim)
	require.Equal(t, 1_600_000_000, h.count("k"), "nobody granted past it: nobody waits behind it")
	require.Equal(t, driver.StatusAdmitted, h.admit("O", "k", 300_000_000, lim, 0, "f1", true).Status,
		"a caller of another flow passes it (counted 2,400,000,000: past its bound)")
	require.Equal(t, driver.StatusQueued, h.admit("N", "k", 1, lim, 0, "f1", true).Status,
		"past its bound, it keeps the room from a newcomer")
	h.release("O", "k", lim)
	require.Equal(t, 1_600_000_000, h.count("k"), "past its bound, it keeps the room from the waiter behind it")
	h.release("H", "k", lim)
	require.Equal(t, 600_000_001, h.count("k"), "it is granted, then the waiter behind it")
	require.Equal(t, driver.StatusAdmitted, h.admit("B", "k", 600_000_000, lim, 0, "f0", true).Status, "its grant claimed")
	require.Equal(t, driver.StatusAdmitted, h.admit("N", "k", 1, lim, 0, "f1", true).Status, "its grant claimed")
}

// A waiter's ask, as the fleet's client makes it (with the epoch the
// store last told: a store's shortcut for a waiter still queued runs),
// behind a heavy waiter of 600,000,000 units, PassFactor times which is
// past what 32 bits hold: W queues behind B, and once the limit it asks
// under has room for it, though not for B, its ask passes B as a
// newcomer's would; B's ask under that limit keeps it queued.
func heavyWaiterOfManyUnitsAsked(t *testing.T, srv Server) {
	c := &clientCalls{t: t, s: srv.Store(t, "heavyWaiterOfManyUnitsAsked")}
	k := []string{"k"}
	require.Equal(t, driver.StatusAdmitted, c.call("H", k, 1_600_000_000, []int{1_700_000_000}, true).Status)
	require.Equal(t, driver.StatusQueued, c.call("B", k, 600_000_000, []int{1_700_000_000}, true).Status)
	require.Equal(t, driver.StatusQueued, c.call("W", k, 200_000_000, []int{1_700_000_000}, true).Status,
		"no room for it")
	require.Equal(t, driver.StatusAdmitted, c.call("W", k, 200_000_000, []int{1_800_000_000}, true).Status,
		"room for it under the limit it asks with, and B far from its bound")
	require.Equal(t, driver.StatusQueued, c.call("B", k, 600_000_000, []int{1_800_000_000}, true).Status)
}

// A weight over a key's limit is refused at once, with nothing sent to
// wait for; a waiter whose key's limit is lowered below its weight is
// refused too, and leaves the queue.
func exceedsLimit(t *testing.T, srv Server) {
	rs := processes(t, srv, "exceeds", 2, 4)
	a, b := rs[0], rs[1]
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := a.AcquireN(ctx, "k", 5)
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, slots.ErrExceedsLimit)
	assert.Equal(t, 4, le.Limit)
	assert.Equal(t, "k", le.Key)
	_, err = a.TryAcquireAllN(5, "other", "k")
	assert.ErrorIs(t, err, slots.ErrExceedsLimit)
	_, err = a.TryAcquireN("k", 0)
	assert.ErrorIs(t, err, slots.ErrBadUnits)

	held, err := b.TryAcquireN("k", 2)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		s, err := a.AcquireN(ctx, "k", 3)
		if err == nil {
			s.Release()
		}
		got <- err
	}()
	queuedIs(t, srv, "exceeds", "k", 1)
	a.SetLimit("k", 2)
	select {
	case err = <-got:
	case <-time.After(wait):
		t.Fatal("the waiter of 3 units under a limit of 2 still waits")
	}
	assert.ErrorIs(t, err, slots.ErrExceedsLimit)
	queuedIs(t, srv, "exceeds", "k", 0)
	held.Release()
	inFlightIs(t, b, "k", 0, "nothing left behind")
}

// waitN starts a waiter named name on r's key "k" for n units.
func (a *admissions) waitN(r *fleet.Registry[string], name string, n int) {
	a.waitAll(r, name, n, "k")
}

// waitAll starts a waiter named name on r's keys for n units.
func (a *admissions) waitAll(r *fleet.Registry[string], name string, n int, keys ...string) {
	a.waitPlaced(nil, r, name, n, keys...)
}

// waitPlaced is waitAll with the waiter's priority and flow set by place
// (nil: none).
func (a *admissions) waitPlaced(place func(context.Context) context.Context, r *fleet.Registry[string], name string, n int, keys ...string) {
	a.wg.Go(func() {
		ctx, cancel := context.WithTimeout(a.ctx, 3*wait)
		defer cancel()
		if place != nil {
			ctx = place(ctx)
		}
		s, err := r.AcquireAllN(ctx, n, keys...)
		a.mu.Lock()
		defer a.mu.Unlock()
		if err != nil {
			a.errs = append(a.errs, errors.Join(errors.New(name), err))
			return
		}
		a.order = append(a.order, name)
		s.Release()
	})
}

// A renewal that puts back a weighted lease found missing under the same
// epoch (it expired) checks room for its units; called on the store
// directly.
func unitsPutBack(t *testing.T, srv Server) {
	s := srv.Store(t, "putback")
	ctx := context.Background()
	admit := func(lease string, units int) driver.AdmitResult {
		res, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{5}, Units: units,
			TTL: 3 * time.Second, Claim: time.Second, Live: time.Second, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		return res
	}
	res := admit("00000000000000000000000000000001", 3)
	require.Equal(t, driver.StatusAdmitted, res.Status)
	epoch := res.Epoch
	n, err := s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 3, n, "a lease of 3 units")
	renew := func(lease string, units int) driver.Fate {
		res, err := s.Renew(ctx, &driver.RenewCall{TTL: 3 * time.Second, Epoch: epoch, Leases: []driver.Renewal{
			{Lease: lease, Units: units, Mode: driver.ModeReassert, Epoch: epoch, Keys: []string{"k"}, Limits: []int{5}}}})
		require.NoError(t, err)
		return res.Leases[0]
	}
	assert.Equal(t, driver.FateRoom, renew("00000000000000000000000000000002", 2), "3 + 2 fits under 5")
	assert.Equal(t, driver.FateGone, renew("00000000000000000000000000000003", 1), "5 + 1 does not")
	assert.Equal(t, driver.FateRenewed, renew("00000000000000000000000000000001", 3))
	n, err = s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 5, n)
	res = admit("00000000000000000000000000000004", 1)
	assert.Equal(t, driver.StatusFull, res.Status)
	assert.Equal(t, int64(5), res.Count, "the refusal's count is in units")
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: time.Second, Pairs: []driver.Release{
		{Key: "k", Lease: "00000000000000000000000000000001", Limit: 5}}}))
	n, err = s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the release freed the lease's 3 units")
}

// A release of several leases serves each key's queue once, with all the
// units it freed, under the lowest limit the call gives the key: a waiter
// of 3 units at the head is granted the three units freed together, where
// serving after each lease would have let the light waiter behind it take
// the first.
func batchRelease(t *testing.T, srv Server) {
	s := srv.Store(t, "batch")
	ctx := context.Background()
	lease := func(i int) string { return fmt.Sprintf("%032x", i) }
	admit := func(i, units, limit int, wait bool) driver.Status {
		res, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease(i), Keys: []string{"k"}, Limits: []int{limit}, Units: units,
			Wait: wait, TTL: batchTTL, Claim: batchTTL / 3, Live: batchTTL, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		return res.Status
	}
	release := func(leaseLimit ...[2]int) {
		var pairs []driver.Release
		for _, p := range leaseLimit {
			pairs = append(pairs, driver.Release{Key: "k", Lease: lease(p[0]), Limit: p[1]})
		}
		require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: batchTTL / 3, Pairs: pairs}))
	}
	for i := 1; i <= 3; i++ {
		require.Equal(t, driver.StatusAdmitted, admit(i, 1, 3, false))
	}
	require.Equal(t, driver.StatusQueued, admit(4, 3, 3, true), "the heavy waiter")
	require.Equal(t, driver.StatusQueued, admit(5, 1, 3, true), "a light one behind it")
	release([2]int{1, 3}, [2]int{2, 3}, [2]int{3, 3})
	assert.Equal(t, driver.StatusAdmitted, admit(4, 3, 3, true), "the heavy waiter was granted the three units")
	assert.Equal(t, driver.StatusQueued, admit(5, 1, 3, true), "the light one waits for them")

	release([2]int{4, 3})
	require.Equal(t, driver.StatusAdmitted, admit(5, 1, 3, true))
	for i := 6; i <= 7; i++ {
		require.Equal(t, driver.StatusAdmitted, admit(i, 1, 3, false))
	}
	for i := 8; i <= 9; i++ {
		require.Equal(t, driver.StatusQueued, admit(i, 1, 3, true))
	}
	count := func() int {
		n, err := s.Count(ctx, "k")
		require.NoError(t, err)
		return n
	}
	release([2]int{5, 2}, [2]int{6, 3})
	assert.Equal(t, 2, count(), "under the lower limit, 2, one unit was granted")
	assert.Equal(t, driver.StatusQueued, admit(9, 1, 2, true))
	assert.Equal(t, driver.StatusAdmitted, admit(8, 1, 2, true), "the first waiter was granted it")

	require.Equal(t, driver.StatusAdmitted, admit(9, 1, 3, true))
	for i := 10; i <= 11; i++ {
		require.Equal(t, driver.StatusQueued, admit(i, 1, 3, true))
	}
	release([2]int{7, 3}, [2]int{8, 2})
	assert.Equal(t, 2, count(), "the lower limit binds in whichever pair it comes")
	assert.Equal(t, driver.StatusQueued, admit(11, 1, 2, true))
	assert.Equal(t, driver.StatusAdmitted, admit(10, 1, 2, true))
}

// batchTTL is the TTL and liveness of batchRelease's calls (their claim
// window a third of it): long enough that nothing expires on a busy
// machine.
const batchTTL = 30 * time.Second
