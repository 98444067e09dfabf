package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/slots"
)

// Leases are renewed while held (a TTL of 300 ms, held for 1.5 s), and
// those of a process that stops renewing expire on the database's clock.
func TestRenewAndExpiry(t *testing.T) {
	srv := pgtest.Start(t)
	a := process(t, srv, "renew", 2, fleet.WithLeaseTTL(300*time.Millisecond))
	b := process(t, srv, "renew", 2, fleet.WithLeaseTTL(300*time.Millisecond))
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		n, err := b.InFlight(context.Background(), "k")
		require.NoError(t, err)
		require.Equal(t, 1, n, "the held lease is renewed")
		time.Sleep(20 * time.Millisecond) // polling a real clock's renewals
	}
	assert.Zero(t, a.Stats().Lost)
	// Renewals update the lease's expiry alone, not indexed: HOT updates,
	// which leave no index entries behind.
	p := pool(t, srv, 1)
	require.Eventually(t, func() bool { // the server's statistics come within a second
		var upd, hot int64
		err := p.QueryRow(context.Background(), "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'inflight_lease'").Scan(&upd, &hot)
		t.Logf("inflight_lease: %d updates, %d of them HOT", upd, hot)
		return err == nil && upd >= 3 && hot == upd
	}, 5*time.Second, 100*time.Millisecond, "every renewal's update is HOT")
	s.Release()
	gone, err := b.TryAcquire("k")
	require.NoError(t, err)
	b.Close() // its lease is not released: it expires
	require.Eventually(t, func() bool {
		n, err := a.InFlight(context.Background(), "k")
		return err == nil && n == 0
	}, 3*time.Second, 10*time.Millisecond, "a lease nobody renews expires")
	gone.Release() // after Close: nothing to send
}

// AcquireAll takes a lease on every key or none, across processes: with a
// provider key of 2 and a model key of 1, a second holder of the model is
// refused on it, and a holder of another model is not.
func TestAcquireAll(t *testing.T) {
	srv := pgtest.Start(t)
	lim := fleet.Keys[string]{Limit: func(k string) int {
		if k == "provider" {
			return 2
		}
		return 1
	}}
	newProc := func() *fleet.Registry[string] {
		s := store(t, srv, "all")
		r := fleet.NewWithKeys(s, 1, lim)
		t.Cleanup(r.Close)
		return r
	}
	a, b := newProc(), newProc()
	s1, err := a.TryAcquireAll("provider", "model:x")
	require.NoError(t, err)
	_, err = b.TryAcquireAll("provider", "model:x")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "model:x", le.Key)
	n, err := b.InFlight(context.Background(), "provider")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "nothing taken by the refused call")
	s2, err := b.TryAcquireAll("provider", "model:y")
	require.NoError(t, err)
	_, err = a.TryAcquireAll("provider", "model:z")
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "provider", le.Key)
	s1.Release()
	s2.Release()
}

// A waiter that gives up leaves the queue: the next release is not handed
// to it, and the key is free for a newcomer at once.
func TestWaiterGivesUp(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := process(t, srv, "giveup", 1), process(t, srv, "giveup", 1)
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = b.Acquire(ctx, "k")
	cancel()
	require.Error(t, err)
	s.Release()
	freedFor(t, a, "k", "no grant waits for a waiter that left")
}

// Interactive waiters go before batch ones queued earlier, across
// processes: each waiter starts once the one before it stands in the
// store's queue, and the holder lets go once all four do.
func TestClassOrder(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := process(t, srv, "class", 1), process(t, srv, "class", 1)
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	p := pool(t, srv, 1)
	var adm admissions
	batch := slots.WithPriority(context.Background(), slots.PriorityBatch)
	for i := range 3 {
		adm.wait(t, batch, b, "batch")
		require.Eventually(t, func() bool { return queued(t, p, "class", "k") == i+1 }, 5*time.Second, time.Millisecond)
	}
	adm.wait(t, slots.WithPriority(context.Background(), slots.PriorityInteractive), a, "interactive")
	require.Eventually(t, func() bool { return queued(t, p, "class", "k") == 4 }, 5*time.Second, time.Millisecond)
	s.Release()
	adm.wg.Wait()
	assert.Equal(t, []string{"interactive", "batch", "batch", "batch"}, adm.order)
}

// A cut reported in one process reaches the other through the learned
// state the store keeps and publishes.
func TestLearnedCapShared(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := process(t, srv, "learn", 100), process(t, srv, "learn", 100)
	require.NoError(t, a.Learn("p", pacing.AdaptiveConfig{Initial: 10}))
	require.NoError(t, b.Learn("p", pacing.AdaptiveConfig{Initial: 10}))
	var held []*slots.Slot
	for range 5 {
		s, err := a.TryAcquire("p")
		require.NoError(t, err)
		held = append(held, s)
	}
	a.Report(held[4], pacing.Verdict{Kind: pacing.Concurrency})
	require.Eventually(t, func() bool { return b.Learned("p").Cap == 4 }, 5*time.Second, 5*time.Millisecond, "the other process learns the cut")
	for _, s := range held {
		s.Release()
	}
}

// A server killed (SIGKILL) and restarted with its data: with
// asynchronous commits it may have lost the last ones, so the fleet starts
// a new epoch (crash recovery empties the epoch's marker), new admissions
// wait one renewal round, and the holders put their leases back. A process
// that knew the epoch before is admitted nothing over the two held leases,
// whichever process's call comes first after the restart.
func TestServerKilled(t *testing.T) {
	srv := pgtest.Start(t)
	ttl := 900 * time.Millisecond
	a := process(t, srv, "killed", 2, fleet.WithLeaseTTL(ttl), fleet.WithBreaker(1, 50*time.Millisecond), fleet.WithUnavailable(fleet.FailClosed))
	b := process(t, srv, "killed", 2, fleet.WithLeaseTTL(ttl), fleet.WithBreaker(1, 50*time.Millisecond), fleet.WithUnavailable(fleet.FailClosed))
	warm, err := b.TryAcquire("warm") // b knows the epoch: a process that never did cannot tell a loss from a first start
	require.NoError(t, err)
	warm.Release()
	s1, err := a.TryAcquire("k")
	require.NoError(t, err)
	s2, err := a.TryAcquire("k")
	require.NoError(t, err)
	srv.Kill()
	srv.Restart()
	// A process that starts after the restart: on Redis it could not tell
	// the loss from a first start; here the store declares the pause.
	c := process(t, srv, "killed", 2, fleet.WithLeaseTTL(ttl), fleet.WithUnavailable(fleet.FailClosed))
	over, err := c.TryAcquire("k")
	newcomerPaused := errors.Is(err, fleet.ErrPaused)
	if err == nil {
		over.Release()
	}
	var admitted atomic.Int32
	var paused bool
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		s, err := b.TryAcquire("k")
		if err == nil {
			admitted.Add(1)
			s.Release()
		}
		if errors.Is(err, fleet.ErrPaused) {
			paused = true
		}
		time.Sleep(10 * time.Millisecond) // tries on a real clock
	}
	assert.True(t, paused, "new admissions wait after the restart")
	assert.True(t, newcomerPaused, "a process that never knew the epoch waits too: the store tells the loss from a first start")
	assert.Zero(t, admitted.Load(), "the holders' leases are back: the key is full")
	n, err := b.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n, "both holders' leases in the store")
	s1.Release()
	s2.Release()
}

// Weighted turns, exactly: with one slot held, waiters of a flow of
// weight 3 (A) and one of weight 1 (B) queue alternately, A1 B1 A2 B2 ...,
// each once the one before it stands in the store's queue; the holder
// then lets go, and each waiter releases as soon as it is admitted. Start
// tags (A: 0, 1/3, 2/3, 1, ...; B: 0, 1, 2, ...), then arrival, give the
// one order; Redis's queue gives the same.
func TestWeightedTurns(t *testing.T) {
	srv := pgtest.Start(t)
	p := pool(t, srv, 1)
	a, b := process(t, srv, "turns", 1), process(t, srv, "turns", 1)
	held, err := a.TryAcquire("k")
	require.NoError(t, err)
	var adm admissions
	flowA := slots.WithFlowWeight(context.Background(), "A", 3)
	flowB := slots.WithFlowWeight(context.Background(), "B", 1)
	for i := 1; i <= 6; i++ {
		adm.wait(t, flowA, a, fmt.Sprint("A", i))
		require.Eventually(t, func() bool { return queued(t, p, "turns", "k") == 2*i-1 }, 5*time.Second, time.Millisecond)
		adm.wait(t, flowB, b, fmt.Sprint("B", i))
		require.Eventually(t, func() bool { return queued(t, p, "turns", "k") == 2*i }, 5*time.Second, time.Millisecond)
	}
	held.Release()
	adm.wg.Wait()
	assert.Equal(t, []string{"A1", "B1", "A2", "A3", "B2", "A4", "A5", "A6", "B3", "B4", "B5", "B6"}, adm.order)
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
