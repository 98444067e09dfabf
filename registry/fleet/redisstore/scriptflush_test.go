package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// leaseID is a lease id made of name, of the length the fleet's are.
func leaseID(name string) string { return fmt.Sprintf("%032x", name) }

// Every operation loads its script again after SCRIPT FLUSH (a restarted
// server has none).
func TestScriptFlushReloads(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := redisstore.New(c, "h")
	ctx := context.Background()
	flush := func() { require.NoError(t, c.ScriptFlush(ctx).Err()) }
	call := func(id string) *driver.AdmitCall {
		return &driver.AdmitCall{Lease: leaseID(id), Keys: []string{"k"}, Limits: []int{2}, TTL: time.Hour, Claim: time.Second,
			Live: time.Hour, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1, Wait: true}
	}
	flush()
	r, err := s.AdmitOne(ctx, call("a"))
	require.NoError(t, err)
	require.Equal(t, driver.StatusAdmitted, r.Status)
	flush()
	rs, err := s.Admit(ctx, []*driver.AdmitCall{call("b"), call("c"), call("d")})
	require.NoError(t, err)
	for i, r := range rs {
		require.NoError(t, r.Err, "%d", i)
	}
	require.Equal(t, []driver.Status{driver.StatusAdmitted, driver.StatusQueued, driver.StatusQueued},
		[]driver.Status{rs[0].Status, rs[1].Status, rs[2].Status})
	flush()
	rr, err := s.Renew(ctx, &driver.RenewCall{TTL: time.Hour, Epoch: r.Epoch, Leases: []driver.Renewal{{Lease: leaseID("a"), Mode: driver.ModeReassert,
		Epoch: r.Epoch, Keys: []string{"k"}, Limits: []int{2}}}})
	require.NoError(t, err)
	require.Equal(t, []driver.Fate{driver.FateRenewed}, rr.Leases)
	flush()
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: time.Hour, Claim: time.Second, Pairs: []driver.Release{{Key: "k", Lease: leaseID("a"), Limit: 2}}}))
	flush()
	errs, err := s.Abandon(ctx, []*driver.AbandonCall{{Lease: leaseID("d"), Keys: []string{"k"}, Limits: []int{2}, TTL: time.Hour, Claim: time.Second},
		{Lease: leaseID("e"), Keys: []string{"k"}, TTL: time.Hour}})
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, errs)
	flush()
	n, err := s.Count(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, 2, n) // b, and c granted by the release
	flush()
	_, err = s.SyncLearned(ctx, &driver.LearnedCall{Key: "k", Presumed: "-", State: `{"k":"k","v":1}`, TTL: time.Hour})
	require.NoError(t, err)
	flush()
	_, err = s.Budget(ctx, &driver.BudgetCall{Key: "b", Limits: [3]int64{10}, Cost: [3]int64{1}})
	require.NoError(t, err)
}
