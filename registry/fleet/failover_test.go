package fleet

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// A failover to a replica that lacks the latest lease is a loss of data,
// not an expiry: the store finds that the server now answering is a
// replica promoted from the one before (by their replication IDs), and new
// admissions wait for a renewal round while the holder puts its lease
// back. Before, the
// lease looked expired: a newcomer took the key's one slot at once, on top
// of the live holder (158 admissions over it in two TTLs of tries), and
// the holder's renewal found no room for its lease.
func TestFailoverToAReplicaWithoutTheLease(t *testing.T) {
	ctx := context.Background()
	master := redistest.Start(t)
	link := redistest.StartProxy(t, master)
	replica := redistest.StartReplica(t, link.Addr)
	sw := redistest.NewSwitch(t, master.Addr)
	const ttl = 3 * time.Second // renewals every second
	holder := New[string](redisstore.New(sw.Client(), "t"), 1, WithLeaseTTL(ttl), WithBreaker(3, 50*time.Millisecond))
	defer holder.Close()
	other := New[string](redisstore.New(sw.Client(), "t"), 1, WithLeaseTTL(ttl), WithBreaker(3, 50*time.Millisecond),
		WithUnavailable(FailClosed))
	defer other.Close()

	// Both know the fleet, and the replica has all of it so far.
	warm, err := other.TryAcquire("warm")
	require.NoError(t, err)
	warm.Release()
	require.NoError(t, master.Client().Do(ctx, "WAIT", 1, 5000).Err())

	link.Cut() // the replica misses what comes next
	held, err := holder.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	master.Kill()
	// A failover takes longer than the 10 ms the scripts leave between
	// two looks at the server (epoch.go): Sentinel's takes seconds.
	time.Sleep(20 * time.Millisecond)
	replica.Promote()
	sw.MoveTo(replica.Addr)
	fresh := New[string](redisstore.New(sw.Client(), "t"), 1, WithLeaseTTL(ttl), WithBreaker(3, 50*time.Millisecond),
		WithUnavailable(FailClosed)) // a process that never knew the old master
	defer fresh.Close()

	// The newcomers try at once and keep trying for two TTLs: the key is
	// full as long as the holder holds.
	over, refused := 0, 0
	for i, end := 0, time.Now().Add(2*ttl); time.Now().Before(end); i++ {
		s, err := []*Registry[string]{fresh, other}[i%2].TryAcquire("k")
		switch {
		case err == nil:
			over++
			s.Release()
		case errors.Is(err, slots.ErrLimitReached):
			refused++
		default:
			require.ErrorIs(t, err, ErrUnavailable, "during the switch")
		}
		time.Sleep(5 * time.Millisecond) // a client's pace, not a wait for a state
	}
	t.Logf("after the failover: %d admissions over the holder, %d refusals; the holder found %d lease missing", over, refused, holder.Stats().Lost)
	assert.Zero(t, over, "admitted on top of the holder")
	assert.Positive(t, refused, "the newcomer reached the new master")
	n, err := other.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the holder's lease is on the new master")
}

// A restart that keeps the data (here an append-only file synced at each
// write) is no failover, though Redis comes back under a new replication
// ID: admissions go on at once, with the lease held before it counted.
// (Taking any new ID as a failover paused them for a renewal round; found
// by review.)
func TestRestartWithTheDataIsNoFailover(t *testing.T) {
	srv := redistest.StartDurable(t)
	const ttl = 3 * time.Second
	r := New[string](redisstore.New(srv.Client(), "t"), 2, WithLeaseTTL(ttl), WithBreaker(3, 50*time.Millisecond),
		WithUnavailable(FailClosed))
	defer r.Close()
	held, err := r.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	srv.Kill()
	srv.Restart()
	var s *slots.Slot
	require.Eventually(t, func() bool {
		s, err = r.TryAcquire("k")
		require.NotErrorIs(t, err, ErrPaused, "paused after a restart that lost nothing")
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "the second slot of 2, once Redis answers")
	defer s.Release()
	_, err = r.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the lease held before the restart counts")
}

// A holder cut off from Redis for longer than its TTL, whose room another
// process has taken meanwhile, does not get its lease back after a
// failover: its renewal puts it back only if there is room, as after an
// expiry. (Making a new epoch on a failover put every missing lease back
// without a check, this one over the cap; found by review.)
func TestFailoverKeepsAnExpiredLeaseOut(t *testing.T) {
	ctx := context.Background()
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master.Addr)
	cut := redistest.StartProxy(t, master)
	hsw, sw := redistest.NewSwitch(t, cut.Addr), redistest.NewSwitch(t, master.Addr)
	const ttl = time.Second
	holder := New[string](redisstore.New(hsw.Client(), "t"), 1, WithLeaseTTL(ttl), WithBreaker(2, 50*time.Millisecond))
	defer holder.Close()
	other := New[string](redisstore.New(sw.Client(), "t"), 1, WithLeaseTTL(ttl), WithBreaker(2, 50*time.Millisecond),
		WithUnavailable(FailClosed))
	defer other.Close()
	hctx, cancel := WithCancelOnLost(ctx)
	defer cancel()
	held, err := holder.Acquire(hctx, "k")
	require.NoError(t, err)
	defer held.Release()

	cut.Cut() // the holder can no longer renew
	var taken *slots.Slot
	require.Eventually(t, func() bool {
		taken, err = other.TryAcquire("k")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the holder's lease expires, and another takes its room")
	defer taken.Release()
	require.NoError(t, master.Client().Do(ctx, "WAIT", 1, 5000).Err())
	master.Kill()
	replica.Promote()
	sw.MoveTo(replica.Addr)
	require.Eventually(t, func() bool {
		n, err := other.InFlight(ctx, "k")
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "the other's lease on the new master")

	hsw.MoveTo(replica.Addr) // the holder comes back, to the new master
	require.Eventually(t, func() bool { return hctx.Err() != nil }, 10*time.Second, 10*time.Millisecond,
		"the holder is told its lease was lost")
	n, err := other.InFlight(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "one lease on a cap of 1")
}

// A second failover inside the first one's pause (A to B, then B to C
// before the pause ends; C had B's pause but not the holder's lease put
// back on B) pauses admissions again from its own start. Found by review:
// it declared no pause (one was there), and newcomers were admitted over
// the live holder at the end of B's (587 times in two TTLs of tries).
func TestSecondFailoverInsideThePause(t *testing.T) {
	ctx := context.Background()
	a := redistest.Start(t)
	linkAB := redistest.StartProxy(t, a)
	b := redistest.StartReplica(t, linkAB.Addr)
	linkBC := redistest.StartProxy(t, b)
	c := redistest.StartReplica(t, linkBC.Addr) // C replicates B
	sw := redistest.NewSwitch(t, a.Addr)
	const ttl = 6 * time.Second // renewals every 2 s
	opts := []Option{WithLeaseTTL(ttl), WithTimeout(100 * time.Millisecond), WithBreaker(3, 50*time.Millisecond)}
	holder := New[string](redisstore.New(sw.Client(), "t"), 1, opts...)
	defer holder.Close()
	other := New[string](redisstore.New(sw.Client(), "t"), 1, append(opts, WithUnavailable(FailClosed))...)
	defer other.Close()
	start := time.Now()
	warm, err := other.TryAcquire("warm")
	require.NoError(t, err)
	warm.Release()
	require.NoError(t, a.Client().Do(ctx, "WAIT", 1, 5000).Err())
	require.Eventually(t, func() bool {
		seen := a.Client().HGet(ctx, "inflight:{t}#heard", "r").Val()
		return seen != "" && c.Client().HGet(ctx, "inflight:{t}#heard", "r").Val() == seen
	}, 5*time.Second, 5*time.Millisecond, "C has what B has")

	linkAB.Cut() // B misses the holder's lease
	held, err := holder.TryAcquire("k")
	require.NoError(t, err)
	defer held.Release()
	a.Kill()
	time.Sleep(20 * time.Millisecond) // a failover takes longer than 10 ms (epoch.go)
	b.Promote()
	sw.MoveTo(b.Addr)
	require.Eventually(t, func() bool {
		_, err := other.TryAcquire("k")
		return errors.Is(err, ErrPaused)
	}, 5*time.Second, 5*time.Millisecond, "B's failover pause")
	require.NoError(t, b.Client().Do(ctx, "WAIT", 1, 5000).Err()) // C has B's pause
	linkBC.Cut()                                                  // C misses what the holder puts back on B
	require.Eventually(t, func() bool { return holder.Stats().Lost > 0 }, 5*time.Second, 5*time.Millisecond,
		"the holder finds its lease missing on B, and puts it back")
	b.Kill()
	time.Sleep(20 * time.Millisecond)
	c.Promote()
	sw.MoveTo(c.Addr)

	over := 0
	for time.Since(start) < 2*ttl {
		s, err := other.TryAcquire("k")
		switch {
		case err == nil:
			over++
			s.Release()
		case errors.Is(err, slots.ErrLimitReached):
		default:
			require.ErrorIs(t, err, ErrUnavailable, "during the switch")
		}
		time.Sleep(5 * time.Millisecond) // a client's pace
	}
	assert.Zero(t, over, "admitted on top of the live holder after the second failover")
}
