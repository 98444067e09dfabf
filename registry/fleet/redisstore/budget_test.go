package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// A Reserve whose caller gives up while the server is slow to answer
// (its context ends, as a client that hangs up ends an HTTP request's)
// charges nothing: the server still runs the call it was sent, and the
// charge it makes is taken back once its reply comes. It stood for the
// rest of the minute, refusing requests that the budget had room for.
func TestBudgetReserveGivenUpChargesNothing(t *testing.T) {
	srv := redistest.Start(t)
	s := redisstore.New(srv.PatientClientFor(t, 10*time.Second), "given-up")
	b, err := fleet.NewBudget(s, "provider", upstream.BudgetLimits{TokensPerMinute: 1000}, 5*time.Second)
	require.NoError(t, err)
	used, err := b.Used(context.Background()) // loads the script: the calls below are EVALSHAs
	require.NoError(t, err)
	require.Equal(t, 0, used[0])
	admin := srv.Client()
	calls := func() int { // the budget's calls the server has run
		stats, err := admin.InfoMap(context.Background(), "commandstats").Result()
		require.NoError(t, err)
		var n int
		_, _ = fmt.Sscanf(stats["Commandstats"]["cmdstat_evalsha"], "calls=%d", &n)
		return n
	}
	before := calls()

	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err = b.Reserve(ctx, upstream.Tokens{Input: 600})
	cancel()
	srv.Cont()
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// The server runs the call it was sent once it runs again, and its
	// reply comes then: the charge it made is taken back, by a call of
	// its own (counted before the budget is read: a read that came first
	// would find nothing charged yet).
	assert.Eventually(t, func() bool { return calls() >= before+2 }, 10*time.Second, 10*time.Millisecond, "the charge and its take-back")
	used, err = b.Used(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 0, used[0], "the request was never sent: nothing stays charged")
	_, err = b.Reserve(context.Background(), upstream.Tokens{Input: 600})
	assert.NoError(t, err, "the budget has room for it")
}
