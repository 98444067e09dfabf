package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// A waiter that asks while new admissions are paused keeps its process
// alive and its place: after the pause the queue is served in its order.
// Before, a paused ask returned before it renewed its process's liveness;
// the pause (a renewal round, about 11 s by default) outlasts it (5 claim
// windows, 5 s), and the first serving after the pause dropped every
// ticket as a dead process's (found by review). On a miniredis whose
// clock the test moves.
func TestPausedAskKeepsItsPlace(t *testing.T) {
	ctx := context.Background()
	m := redistest.StartMini(t)
	s := redisstore.New(m.Client(), "t")
	ask := func(lease, proc string, epoch int64, want driver.Status) driver.AdmitResult {
		t.Helper()
		res, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease, Keys: []string{"k"}, Limits: []int{1},
			TTL: 6 * time.Second, Epoch: epoch, Pause: 2 * time.Second, Wait: true, Claim: time.Second, Live: 3 * time.Second,
			Proc: proc, Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(t, err)
		require.NoError(t, res.Err)
		require.Equal(t, want, res.Status, lease)
		return res
	}
	held := ask("b", "p0", 0, driver.StatusAdmitted)
	ask("v1", "p1", held.Epoch, driver.StatusQueued)
	ask("v2", "p2", held.Epoch, driver.StatusQueued)
	m.Srv.Del("inflight:{t}#epoch") // the store lost its epoch: the next call pauses admissions
	m.Advance(time.Millisecond)
	ask("n", "p0", held.Epoch, driver.StatusPaused)
	m.Advance(1900 * time.Millisecond)
	ask("v1", "p1", held.Epoch, driver.StatusPaused)
	ask("v2", "p2", held.Epoch, driver.StatusPaused)
	// The pause is over. The waiters' processes are live for 3 s from their
	// last asks, less a margin of 1.5 claim windows (queue.go, dead): from
	// the first, that is over; from the paused ones, not.
	m.Advance(200 * time.Millisecond)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: 6 * time.Second, Claim: time.Second,
		Pairs: []driver.Release{{Key: "k", Lease: "b", Limit: 1}}}))
	ask("v2", "p2", 0, driver.StatusQueued)
	ask("v1", "p1", 0, driver.StatusAdmitted)
	n, err := s.Count(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
}
