package fleettest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// A store that heard no call for longer than half the TTL (every process
// stopped or cut off, or the store itself hung) counts a lease's TTL only
// in time it was heard (driver.Store): a lease that expired in the
// silence is held after it, so a newcomer on its full key is refused and
// its holder's renewal finds it. A lease that expires while the store is
// heard is gone as before.
func silenceKeepsLeases(t *testing.T, srv Server) {
	ctx := context.Background()
	s := srv.Store(t, "silence")
	const ttl = 300 * time.Millisecond
	var epoch int64
	admit := func(lease, key string, ttl time.Duration) driver.AdmitResult {
		t.Helper()
		res, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: lease, Keys: []string{key}, Limits: []int{1}, Units: 1,
			TTL: ttl, Claim: time.Second, Live: time.Minute, Weight: 1, Proc: "p-" + lease,
			MaxQueue: -1, MaxFlowQueue: -1, Epoch: epoch})
		require.NoError(t, err)
		epoch = res.Epoch
		return res
	}
	require.Equal(t, driver.StatusAdmitted, admit("held", "k", ttl).Status)
	silent := time.NewTimer(3 * ttl) // the silence: no call to the store
	<-silent.C
	res := admit("newcomer", "k", ttl)
	assert.Equal(t, driver.StatusFull, res.Status, "admitted over a lease that expired in the silence: %+v", res)
	renewed, err := s.Renew(ctx, &driver.RenewCall{TTL: ttl, Epoch: epoch, Leases: []driver.Renewal{
		{Lease: "held", Units: 1, Mode: driver.ModeReport, Epoch: epoch, Keys: []string{"k"}, Limits: []int{1}}}})
	require.NoError(t, err)
	assert.Equal(t, []driver.Fate{driver.FateRenewed}, renewed.Leases, "the holder's renewal after the silence")

	// Heard: calls with a TTL of a minute find no silence in the time a
	// lease of 100 ms takes to expire.
	require.Equal(t, driver.StatusAdmitted, admit("dead", "j", 100*time.Millisecond).Status)
	require.Eventually(t, func() bool {
		n, err := s.Count(ctx, "j")
		return err == nil && n == 0
	}, wait, 10*time.Millisecond, "the lease of 100 ms expires")
	assert.Equal(t, driver.StatusAdmitted, admit("next", "j", time.Minute).Status, "a lease that expired while the store was heard is gone")
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: time.Minute, Claim: time.Second, Pairs: []driver.Release{
		{Key: "k", Lease: "held", Limit: 1}, {Key: "j", Lease: "next", Limit: 1}}}))
}
