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

// failoverRig is a store whose master fails over to a replica that missed
// the writes made after cut: the leases written then are lost.
type failoverRig struct {
	t               *testing.T
	s               *redisstore.Store
	master, replica *redistest.Server
	link            *redistest.Proxy
	sw              *redistest.Switch
}

const (
	failoverTTL   = 6 * time.Second
	failoverPause = 2 * time.Second
)

func newFailoverRig(t *testing.T) *failoverRig {
	master := redistest.Start(t)
	link := redistest.StartProxy(t, master)
	replica := redistest.StartReplica(t, link.Addr)
	sw := redistest.NewSwitch(t, master.Addr)
	return &failoverRig{t: t, s: redisstore.New(sw.Client(), "t"), master: master, replica: replica, link: link, sw: sw}
}

// admit makes lease's call on keys, each of limit 1, and wants status.
func (f *failoverRig) admit(lease string, keys []string, wait bool, want driver.Status) driver.AdmitResult {
	f.t.Helper()
	limits := make([]int, len(keys))
	for i := range limits {
		limits[i] = 1
	}
	res, err := f.s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: lease, Keys: keys, Limits: limits,
		TTL: failoverTTL, Pause: failoverPause, Wait: wait, Claim: time.Second, Live: 10 * time.Second, Proc: "p",
		Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
	require.NoError(f.t, err)
	require.NoError(f.t, res.Err)
	require.Equal(f.t, want, res.Status, lease)
	return res
}

// cut makes the replica miss every write from now on.
func (f *failoverRig) cut() {
	f.t.Helper()
	require.NoError(f.t, f.master.Client().Do(context.Background(), "WAIT", 1, 5000).Err())
	f.link.Cut()
}

// failOver kills the master and promotes the replica, which the store's
// client then reaches.
func (f *failoverRig) failOver() {
	f.master.Kill()
	// A failover takes longer than the 10 ms the scripts leave between
	// two looks at the server (epoch.go): Sentinel's takes seconds.
	time.Sleep(20 * time.Millisecond)
	f.replica.Promote()
	f.sw.MoveTo(f.replica.Addr)
}

// A release that is the first call to reach a replica promoted without
// the latest lease finds the failover, as an admission would, and serves
// no queue: new admissions wait while the holder puts its lease back.
// Before, it served the queue of the key it freed, and a waiter of two
// keys was granted the room of the lost lease on the other key: two
// holders on a cap of 1, and the lost lease's holder, live, was told its
// lease was gone.
func TestReleaseOnTheNewMasterServesNobody(t *testing.T) {
	ctx := context.Background()
	f := newFailoverRig(t)
	f.admit("b", []string{"k2"}, false, driver.StatusAdmitted)
	f.admit("w", []string{"k1", "k2"}, true, driver.StatusQueued) // waits for k2
	f.cut()
	x := f.admit("x", []string{"k1"}, false, driver.StatusAdmitted) // lost with the master
	f.failOver()

	require.NoError(t, f.s.Release(ctx, &driver.ReleaseCall{TTL: failoverTTL, Pause: failoverPause, Claim: time.Second,
		Pairs: []driver.Release{{Key: "k2", Lease: "b", Limit: 1}}}))
	res, err := f.s.Renew(ctx, &driver.RenewCall{TTL: failoverTTL, Epoch: x.Epoch, Pause: failoverPause, Leases: []driver.Renewal{
		{Lease: "x", Units: 1, Mode: driver.ModeReassert, Epoch: x.Epoch, Keys: []string{"k1"}, Limits: []int{1}}}})
	require.NoError(t, err)
	require.Len(t, res.Leases, 1)
	assert.Equal(t, driver.FateRoom, res.Leases[0], "the holder's lease goes back: its room was not given away")
	n, err := f.s.Count(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "units held on k1, a cap of 1")
}

// An abandon that is the first call to reach the new master does not
// serve either: the same room would go to the same waiter.
func TestAbandonOnTheNewMasterServesNobody(t *testing.T) {
	ctx := context.Background()
	f := newFailoverRig(t)
	f.admit("b", []string{"k2"}, false, driver.StatusAdmitted)
	f.admit("w", []string{"k1", "k2"}, true, driver.StatusQueued)
	f.cut()
	x := f.admit("x", []string{"k1"}, false, driver.StatusAdmitted)
	f.failOver()

	errs, err := f.s.Abandon(ctx, []*driver.AbandonCall{{Lease: "b", Keys: []string{"k2"}, Limits: []int{1},
		TTL: failoverTTL, Pause: failoverPause, Claim: time.Second}})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	res, err := f.s.Renew(ctx, &driver.RenewCall{TTL: failoverTTL, Epoch: x.Epoch, Pause: failoverPause, Leases: []driver.Renewal{
		{Lease: "x", Units: 1, Mode: driver.ModeReassert, Epoch: x.Epoch, Keys: []string{"k1"}, Limits: []int{1}}}})
	require.NoError(t, err)
	assert.Equal(t, driver.FateRoom, res.Leases[0], "the holder's lease goes back")
	n, err := f.s.Count(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "units held on k1, a cap of 1")
}
