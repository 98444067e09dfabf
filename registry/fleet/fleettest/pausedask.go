package fleettest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Waiters that keep asking while new admissions are paused keep their
// places: their asks renew their processes' liveness, and the queue is
// served in its order once the pause is over. (A paused ask that renewed
// nothing let the waiters' liveness lapse in a pause, and the first
// serving after it dropped them all as dead processes' tickets.) The pause
// is declared by a caller that saw another epoch, of 3 s from the
// epoch's birth; the waiters' processes live 3 s after each ask, less a
// margin of 1.5 claim windows of 1 s, and they ask every 100 ms, a
// client's pace.
func pausedAskKeepsItsPlace(t *testing.T, srv Server) {
	ctx := context.Background()
	s := srv.Store(t, "pausedask")
	const ttl, pause, claim = 6 * time.Second, 3 * time.Second, time.Second
	ask := func(lease, proc, key string, wait bool, epoch int64) driver.AdmitResult {
		t.Helper()
		res, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease, Keys: []string{key}, Limits: []int{1},
			TTL: ttl, Epoch: epoch, Pause: pause, Wait: wait, Claim: claim, Live: 3 * claim,
			Proc: proc, Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		require.NoError(t, res.Err)
		return res
	}
	held := ask("b", "p0", "k", false, 0)
	require.Equal(t, driver.StatusAdmitted, held.Status)
	require.Equal(t, driver.StatusQueued, ask("v1", "p1", "k", true, held.Epoch).Status)
	require.Equal(t, driver.StatusQueued, ask("v2", "p2", "k", true, held.Epoch).Status)
	require.Equal(t, driver.StatusPaused, ask("n", "p0", "other", false, held.Epoch+1).Status, "a caller that saw another epoch")
	for ask("n", "p0", "other", false, held.Epoch).Status == driver.StatusPaused {
		for _, v := range []string{"v1", "v2"} {
			st := ask(v, "p"+v[1:], "k", true, held.Epoch).Status
			require.Contains(t, []driver.Status{driver.StatusPaused, driver.StatusQueued}, st, v) // queued once the pause ends
		}
		time.Sleep(100 * time.Millisecond) // the waiters' pace
	}
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: ttl, Pause: pause, Claim: claim,
		Pairs: []driver.Release{{Key: "k", Lease: "b", Limit: 1}}}))
	assert.Equal(t, driver.StatusQueued, ask("v2", "p2", "k", true, held.Epoch).Status, "v2 behind v1")
	assert.Equal(t, driver.StatusAdmitted, ask("v1", "p1", "k", true, held.Epoch).Status, "v1 first, as it queued")
}
