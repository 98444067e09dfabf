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
// not an expiry: the store finds that the server now answering is another
// (its replication ID changed), makes a new epoch, and new admissions wait
// for a renewal round while the holder puts its lease back. Before, the
// lease looked expired: a newcomer took the key's one slot at once, on top
// of the live holder (158 admissions over it in two TTLs of tries), and
// the holder's renewal found no room for its lease.
func TestFailoverToAReplicaWithoutTheLease(t *testing.T) {
	ctx := context.Background()
	master := redistest.Start(t)
	link := redistest.StartProxy(t, master)
	replica := redistest.StartReplica(t, link.Addr)
	sw := redistest.NewSwitch(t, master)
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
	replica.Promote()
	sw.MoveTo(replica)
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
