package pgstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// BenchmarkDeepServe measures a hand-off on a key whose serving looks far
// before it grants: a (limit 10) is full, and PassScan-1 waiters of a and
// c, passed over while c is paused (a limit of 0: they keep no place on
// a however often they are passed), stand before the light waiters of a.
// Each op queues one more light waiter at the tail (its call serves a
// from the head too), releases the lease granted by the op before it (its
// serving passes the waiters of a and c, and grants the next light
// waiter), and claims that grant. Run it with
//
//	go test -run '^$' -bench DeepServe ./registry/fleet/pgstore
func BenchmarkDeepServe(b *testing.B) {
	s := store(b, pgtest.Start(b), "deep")
	ctx := context.Background()
	const lim = 10
	call := func(id string, keys []string, limits []int, wait bool) driver.AdmitResult {
		r, err := s.AdmitOne(ctx, &driver.AdmitCall{Lease: id, Keys: keys, Limits: limits, Units: 1, TTL: time.Hour,
			Pause: time.Hour, Wait: wait, Claim: time.Hour, Live: time.Hour, Weight: 1, Proc: "p", MaxQueue: -1, MaxFlowQueue: -1})
		require.NoError(b, err)
		return r
	}
	require.Equal(b, driver.StatusAdmitted, call("Gc", []string{"c"}, []int{1}, false).Status)
	for i := range lim {
		require.Equal(b, driver.StatusAdmitted, call(fmt.Sprint("H", i), []string{"a"}, []int{lim}, false).Status)
	}
	for i := range driver.PassScan - 1 {
		require.Equal(b, driver.StatusQueued, call(fmt.Sprint("F", i), []string{"a", "c"}, []int{lim, 0}, true).Status)
	}
	require.Equal(b, driver.StatusQueued, call("L0", []string{"a"}, []int{lim}, true).Status)
	held := "H0"
	i := 0
	for b.Loop() {
		i++
		require.Equal(b, driver.StatusQueued, call(fmt.Sprint("L", i), []string{"a"}, []int{lim}, true).Status)
		require.NoError(b, s.Release(ctx, &driver.ReleaseCall{TTL: time.Hour, Claim: time.Hour,
			Pairs: []driver.Release{{Key: "a", Lease: held, Limit: lim}}}))
		held = fmt.Sprint("L", i-1)
		require.Equal(b, driver.StatusAdmitted, call(held, []string{"a"}, []int{lim}, true).Status, "%s granted", held)
	}
}
