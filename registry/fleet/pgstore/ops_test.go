package pgstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/slots"
)

// Renewals update the lease's expiry alone, not indexed: HOT updates,
// which leave no index entries behind (a TTL of 300 ms, held for 1.5 s).
func TestRenewalsStayHOT(t *testing.T) {
	srv := pgtest.Start(t)
	a := process(t, srv, "renew", 2, fleet.WithLeaseTTL(300*time.Millisecond))
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	defer s.Release()
	p := pool(t, srv, 1)
	require.Eventually(t, func() bool { // the server's statistics come within a second
		var upd, hot int64
		err := p.QueryRow(context.Background(), "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'inflight_lease'").Scan(&upd, &hot)
		t.Logf("inflight_lease: %d updates, %d of them HOT", upd, hot)
		return err == nil && upd >= 3 && hot == upd
	}, 10*time.Second, 100*time.Millisecond, "every renewal's update is HOT")
	assert.Zero(t, a.Stats().Lost)
}

// A server killed (SIGKILL) and restarted with its data: with
// asynchronous commits it may have lost the last ones, so the store starts
// a new epoch (crash recovery empties the epoch's marker) and declares the
// pause itself. So even a process that starts after the restart, and never
// knew the epoch before, waits while the holders put their leases back: on
// Redis, which cannot tell a loss from a first start, it would not. (The
// conformance suite checks the processes that knew the epoch.)
func TestNewcomerPausedAfterCrash(t *testing.T) {
	srv := pgtest.Start(t)
	ttl := 900 * time.Millisecond
	a := process(t, srv, "killed", 2, fleet.WithLeaseTTL(ttl), fleet.WithBreaker(1, 50*time.Millisecond), fleet.WithUnavailable(fleet.FailClosed))
	s1, err := a.TryAcquire("k")
	require.NoError(t, err)
	s2, err := a.TryAcquire("k")
	require.NoError(t, err)
	srv.Kill()
	srv.Restart()
	c := process(t, srv, "killed", 2, fleet.WithLeaseTTL(ttl), fleet.WithUnavailable(fleet.FailClosed))
	over, err := c.TryAcquire("k")
	if err == nil {
		over.Release()
	}
	assert.ErrorIs(t, err, fleet.ErrPaused, "the newcomer waits: the store tells the loss from a first start")
	s1.Release()
	s2.Release()
}

// A database whose transactions default to REPEATABLE READ would let two
// admissions count the same stale set: every call refuses it, clearly.
func TestIsolationRefused(t *testing.T) {
	srv := pgtest.Start(t)
	cfg, err := pgxpool.ParseConfig(srv.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	s, err := pgstore.New(context.Background(), p, "iso")
	require.NoError(t, err)
	_, err = s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: "x", Keys: []string{"k"}, Limits: []int{1}, TTL: time.Second, Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "READ COMMITTED")
}

// A thousand slots held at once by one process whose pool has 10
// connections: no connection is held by a holder, so all are admitted
// (from 1,000 goroutines at once), renewed past their TTL (6 s: under the
// race detector on two busy cores, a renewal round of 1,000 leases has
// taken over a second) with nothing lost, and released.
func TestThousandHeldOnTenConnections(t *testing.T) {
	srv := pgtest.Start(t)
	p := pool(t, srv, 10)
	s, err := pgstore.New(context.Background(), p, "thousand")
	require.NoError(t, err)
	// Calls of up to 2 s (a third of the TTL) and no local fallback: under
	// -race a call of the default 500 ms timed out once, and its local
	// admission, put into the store without a check later, was counted
	// beside its late call's lease (1,001 for a moment).
	r := fleet.New[string](s, 1000, fleet.WithLeaseTTL(6*time.Second), fleet.WithTimeout(2*time.Second), fleet.WithUnavailable(fleet.FailClosed))
	t.Cleanup(r.Close)
	held := make([]*slots.Slot, 1000)
	errs := make([]error, 1000)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range held {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			held[i], errs[i] = r.Acquire(ctx, "k")
		})
	}
	wg.Wait()
	t.Logf("1,000 admitted in %v on %d connections at most", time.Since(t0).Round(time.Millisecond), p.Config().MaxConns)
	for _, err := range errs {
		require.NoError(t, err)
	}
	_, err = r.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached, "the 1,001st")
	for deadline := time.Now().Add(6500 * time.Millisecond); time.Now().Before(deadline); {
		n, err := r.InFlight(context.Background(), "k")
		require.NoError(t, err)
		require.Equal(t, 1000, n, "held and renewed")
		require.LessOrEqual(t, p.Stat().TotalConns(), int32(10))
		time.Sleep(100 * time.Millisecond) // polling a real clock's renewals
	}
	st := r.Stats()
	assert.Zero(t, st.Lost)
	assert.Zero(t, st.Degraded)
	for _, s := range held {
		s.Release()
	}
	require.Eventually(t, func() bool {
		n, err := r.InFlight(context.Background(), "k")
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "all released")
}
