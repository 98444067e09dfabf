package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
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
