package fleettest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// An admitted lease's call made again (a client does so when a learned
// cap was cut while the first call was on its way: see driver.AdmitCall,
// step 6): a plain admission of 2 units on keys a and b, made again with
// a's limit lowered below its count (b within its own) or with the same
// limits, with and without Wait, the queue's bounds at 0. Within its
// limits it is admitted again, with a start; over them it is given back
// on both keys, a's queue is served under the lowered limit (another
// process's waiter queued meanwhile is granted), and it is refused, or
// with Wait queued past the bounds.
func admittedOverALoweredLimit(t *testing.T, srv Server) {
	ctx := context.Background()
	s := srv.Store(t, "lowered")
	call := func(lease string, keys []string, limits []int, units int, wait bool, epoch int64, proc string) *driver.AdmitCall {
		return &driver.AdmitCall{Lease: lease, Keys: keys, Limits: limits, Units: units, TTL: 10 * time.Second,
			Wait: wait, Starts: true, Claim: time.Second, Live: 5 * time.Second, Weight: 1, Proc: proc,
			MaxQueue: 0, MaxFlowQueue: 0, Epoch: epoch}
	}
	for _, tc := range []struct {
		name    string
		wait    bool
		lowered bool
	}{{"NoWaitLowered", false, true}, {"WaitLowered", true, true}, {"NoWaitSame", false, false}, {"WaitSame", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := "a-"+tc.name, "b-"+tc.name
			var epoch int64
			for i := range 8 {
				res, err := s.AdmitOne(ctx, call("f"+tc.name+string(rune('0'+i)), []string{a}, []int{10}, 1, false, epoch, "me"))
				require.NoError(t, err)
				require.Equal(t, driver.StatusAdmitted, res.Status)
				epoch = res.Epoch
			}
			l := "L" + tc.name
			res, err := s.AdmitOne(ctx, call(l, []string{a, b}, []int{10, 10}, 2, tc.wait, epoch, "me"))
			require.NoError(t, err)
			require.Equal(t, driver.StatusAdmitted, res.Status)
			require.Equal(t, []int64{10, 2}, res.Counts)
			w := call("W"+tc.name, []string{a}, []int{10}, 1, true, epoch, "other")
			w.MaxQueue, w.MaxFlowQueue = -1, -1
			res, err = s.AdmitOne(ctx, w)
			require.NoError(t, err)
			require.Equal(t, driver.StatusQueued, res.Status)
			limits := []int{10, 10}
			if tc.lowered {
				limits = []int{9, 10}
			}
			res, err = s.AdmitOne(ctx, call(l, []string{a, b}, limits, 2, tc.wait, epoch, "me"))
			require.NoError(t, err)
			na, err := s.Count(ctx, a)
			require.NoError(t, err)
			nb, err := s.Count(ctx, b)
			require.NoError(t, err)
			switch {
			case !tc.lowered:
				assert.Equal(t, driver.StatusAdmitted, res.Status)
				assert.Equal(t, []int64{10, 2}, res.Counts, "the start of a call made again within its limits")
				assert.NotZero(t, res.Start)
				assert.Equal(t, 10, na)
				assert.Equal(t, 2, nb)
			case tc.wait:
				assert.Equal(t, driver.StatusQueued, res.Status, "given back, it queues past the bounds: %+v", res)
				assert.Equal(t, 0, res.Key)
				assert.Equal(t, 9, na, "given back, and a's queue served under 9: W granted")
				assert.Equal(t, 0, nb)
			default:
				assert.Equal(t, driver.StatusFull, res.Status, "%+v", res)
				assert.Equal(t, 0, res.Key)
				assert.Equal(t, 9, na, "given back, and a's queue served under 9: W granted")
				assert.Equal(t, 0, nb)
			}
		})
	}
}

// A call whose lease has expired (a grant not claimed in time, or a
// holder that stopped renewing) is a newcomer when it is made again, even
// while the expired lease is still stored: one of one key that waits and
// is admitted beside a heavy waiter is counted against it (driver.Pass),
// as any newcomer. Behind a waiter of 5 units on a key with 4 free,
// PassFactor*5-2 newcomers of one unit pass it, then a lease of one unit
// that expires; its call made again is the last to pass: the next newcomer
// waits.
func expiredLeasePasses(t *testing.T, srv Server) {
	ctx := context.Background()
	s := srv.Store(t, "expiredpass")
	var epoch int64
	admit := func(lease string, units int, wait bool, ttl time.Duration) driver.AdmitResult {
		t.Helper()
		res, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{10}, Units: units,
			TTL: ttl, Wait: wait, Starts: true, Claim: time.Second, Live: time.Minute, Weight: 1, Proc: "p-" + lease,
			MaxQueue: -1, MaxFlowQueue: -1, Epoch: epoch})
		require.NoError(t, err)
		epoch = res.Epoch
		return res
	}
	require.Equal(t, driver.StatusAdmitted, admit("filler", 6, false, time.Minute).Status)
	require.Equal(t, driver.StatusQueued, admit("heavy", 5, true, time.Minute).Status, "6 + 5 over 10")
	for i := range driver.PassFactor*5 - 2 {
		l := fmt.Sprintf("n%d", i)
		res := admit(l, 1, true, time.Minute)
		require.Equal(t, driver.StatusAdmitted, res.Status, "pass %d: 6 + 1 fits, and the heavy waiter's bound is not reached", i+1)
		require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: time.Second, Pairs: []driver.Release{{Key: "k", Lease: l, Limit: 10}}}))
	}
	// No call but Count touches k from here until "late" is made again, so
	// a store that deletes expired leases only in its calls still has the
	// expired one then, however long the loop above took.
	const ttl = 100 * time.Millisecond
	require.Equal(t, driver.StatusAdmitted, admit("late", 1, true, ttl).Status, "it passes the heavy waiter")
	require.Eventually(t, func() bool {
		n, err := s.Count(ctx, "k")
		return err == nil && n == 6
	}, wait, 10*time.Millisecond, "the lease of one unit expires")
	res := admit("late", 1, true, time.Minute)
	require.Equal(t, driver.StatusAdmitted, res.Status, "its call made again passes the heavy waiter: %+v", res)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{Claim: time.Second, Pairs: []driver.Release{{Key: "k", Lease: "late", Limit: 10}}}))
	res = admit("next", 1, true, time.Minute)
	assert.Equal(t, driver.StatusQueued, res.Status, "the heavy waiter's bound reached, counting the expired lease's call: %+v", res)
	n, err := s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 6, n, "the free units kept for the heavy waiter")
}
