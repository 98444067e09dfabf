package fleettest

import (
	"context"
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
