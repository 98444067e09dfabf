package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// Waiters queued on a full key hold back no one on other keys: a request
// whose keys are free is admitted at once, while two earlier ones wait for
// model:x (in the fleet's queue, on both of their keys).
func TestWaitersDoNotBlockOtherKeys(t *testing.T) {
	m := newMini(t)
	r := m.registry(100, WithPoll(5*time.Millisecond, 50*time.Millisecond))
	r.SetLimit("model:x", 1)
	hold, err := r.TryAcquire("model:x")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := r.AcquireAll(ctx, "provider", "model:x")
			errs <- err
		}()
		eventually(t, "queued", func() bool { return r.Stats().Waiting == i+1 })
	}
	eventually(t, "both queued in Redis, holding back no one here", func() bool {
		r.waits.mu.Lock()
		defer r.waits.mu.Unlock()
		for _, w := range r.allWaiters() {
			if w.ticket == "" || len(w.blocked) != 0 {
				return false
			}
		}
		return len(r.waits.tickets) == 2
	})
	yctx, ycancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ycancel()
	s, err := r.AcquireAll(yctx, "provider", "model:y")
	require.NoError(t, err, "free keys are not held back")
	s.Release()
	cancel()
	<-errs
	<-errs
	hold.Release()
}

// Fleet waiters go by priority class, then arrival: an interactive request
// that comes after three batch ones waiting on a full key is admitted
// first. Each waits on k and a free key of its own: a ticket of two keys,
// granted when both have room. The release's hand-off and each next one
// wake the waiters.
func TestWaitersByClass(t *testing.T) {
	m := newMini(t)
	r := m.registry(1, WithLeaseTTL(time.Minute), WithPoll(time.Minute, time.Minute))
	<-r.subscribed
	hold, err := r.TryAcquire("k")
	require.NoError(t, err)
	allQueued := func(n int) func() bool { // in Redis, not only on their way
		return func() bool {
			q, err := m.Srv.ZMembers("inflight:{t}:k#q")
			return err == nil && len(q) == n
		}
	}
	type admitted struct {
		prio slots.Priority
		s    *slots.Slot
	}
	got := make(chan admitted, 4)
	n := 0
	acquire := func(p slots.Priority) {
		n++
		own := fmt.Sprint("free", n)
		go func() {
			s, err := r.AcquireAll(slots.WithPriority(context.Background(), p), "k", own)
			assert.NoError(t, err)
			got <- admitted{p, s}
		}()
	}
	for range 3 {
		acquire(slots.PriorityBatch)
	}
	eventually(t, "three batch waiters queue for k", allQueued(3))
	acquire(slots.PriorityInteractive)
	eventually(t, "and the interactive one, ahead of them", allQueued(4))
	r.waits.mu.Lock()
	assert.Equal(t, core.Rank(core.ClassHigh), r.waits.queues["k"][0].rank)
	r.waits.mu.Unlock()

	hold.Release()
	next := func() admitted {
		select {
		case a := <-got:
			return a
		case <-time.After(5 * time.Second):
			t.Fatal("no waiter admitted: a wake-up lost")
			return admitted{}
		}
	}
	first := next()
	assert.Equal(t, slots.PriorityInteractive, first.prio, "the interactive request goes first")
	first.s.Release()
	for range 3 {
		a := next()
		assert.Equal(t, slots.PriorityBatch, a.prio)
		a.s.Release()
	}
}

// lateListen is a store whose Listen begins only once start is closed: a
// process that subscribes for the first time after its waiters queued (a
// Cluster's first calls can be slow).
type lateListen struct {
	driver.Store
	start chan struct{}
}

func (s *lateListen) Listen(ctx context.Context, proc string, l driver.Listener) {
	select {
	case <-s.start:
	case <-ctx.Done():
		return
	}
	s.Store.Listen(ctx, proc, l)
}

// A grant made before the waiter's process first subscribed is claimed once
// it does: the first Listening wakes the waiters, as every later one does.
// Without it the waiter would ask again only at its next poll, here half a
// minute on, and the grant's claim window may be over by then.
func TestGrantBeforeTheFirstSubscription(t *testing.T) {
	ms := memstore.New()
	a := New[string](ms, 1, WithLeaseTTL(5*time.Minute), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, a) })
	late := &lateListen{Store: ms, start: make(chan struct{})}
	b := New[string](late, 1, WithLeaseTTL(5*time.Minute), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, b) })
	askWhenWoken(b)
	<-a.subscribed

	hold, err := a.TryAcquire("k")
	require.NoError(t, err)
	got := make(chan result, 1)
	go func() {
		s, err := b.Acquire(context.Background(), "k")
		got <- result{s, err}
	}()
	require.Eventually(t, func() bool { return ms.Queued("k") == 1 }, 10*time.Second, time.Millisecond, "b's waiter is queued in the store")
	hold.Release() // the store grants b's waiter, and no one hears it
	require.Eventually(t, func() bool { return ms.Queued("k") == 0 }, 10*time.Second, time.Millisecond, "the grant is made")
	select {
	case <-b.subscribed:
		t.Fatal("b listened before it was let")
	default:
	}
	close(late.start)
	select {
	case g := <-got:
		require.NoError(t, g.err)
		assert.Equal(t, 1, b.Local().InFlight("k"))
		g.s.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the grant made before b first listened was not claimed")
	}
}
