package fleet

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/slots"
)

// Close cuts a pipeline short: its callers are told ErrClosed at once, not
// after the pipeline's abandon, which waits for storeMu (held here as a
// removal or renewal under way on a slow Redis would hold it) and then has
// a call timeout of its own.
func TestCloseAnswersCutPipelineAtOnce(t *testing.T) {
	m := newMini(t)
	r, _, s, inPipe := pipelineOnItsWay(t, m, 1)
	r.storeMu.Lock() // a removal under way
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	select {
	case res := <-inPipe:
		assert.ErrorIs(t, res.err, ErrClosed)
	case <-time.After(3 * time.Second):
		t.Error("the cut pipeline's caller waits for its abandon (storeMu, then a call timeout)")
	}
	r.storeMu.Unlock()
	<-closed
	tombs := tombstones(m)
	assert.Equal(t, 1, tombs, "the cut call is still abandoned before Close returns")
	s.Release()
}

// An Observer of the local registry that panics on the release event (a
// metrics bug) must not keep the lease in Redis: the removal is queued
// all the same, as for a LimitFunc that panics.
func TestObserverPanicInReleaseRemovesLease(t *testing.T) {
	m := newMini(t)
	obs, boom := panickingObserver(slots.EventReleased)
	r := m.registry(10, WithLeaseTTL(time.Minute), WithLocalOptions(slots.WithObserver(obs)))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.Len(t, m.leases("k"), 1)
	boom.Store(true)
	assert.Panics(t, func() { s.Release() })
	boom.Store(false)
	eventually(t, "the lease is removed from Redis", func() bool { return len(m.leases("k")) == 0 })
}

// A lease whose renewal failed once (l.sent, kept for good) is released by
// an abandon: it must still hand the key to a waiter elsewhere in the
// fleet and wake it, not leave it to its next poll (here 30 s away).
func TestReleaseAfterFailedRenewalWakesFleet(t *testing.T) {
	m := newMini(t)
	a := m.registry(1, WithLeaseTTL(time.Minute))
	b := m.registry(1, WithLeaseTTL(time.Minute), WithPoll(time.Minute, time.Minute))
	b.claim = time.Minute // a queued waiter asks again only after 30 s
	<-b.subscribed
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	m.Srv.SetError("LOADING down for one renewal")
	a.renew() // fails: the lease is marked sent
	m.Srv.SetError("")
	require.True(t, a.renew(), "Redis is back; the lease is renewed")
	got := make(chan error, 1)
	go func() {
		s, err := b.AcquireAll(context.Background(), "k", "x")
		if err == nil {
			s.Release()
		}
		got <- err
	}()
	eventually(t, "b queued for k, in Redis", func() bool {
		q, err := m.Srv.ZMembers("inflight:{t}:k#q")
		return err == nil && len(q) == 1
	})
	s.Release()
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the release did not wake the waiter: no wake-up published")
	}
}

// tombstones counts the abandoned lease ids in m.
func tombstones(m *mini) int {
	n := 0
	for _, k := range m.Srv.Keys() {
		if strings.HasPrefix(k, "inflight:{t}:abandoned:") {
			n++
		}
	}
	return n
}

// A cut pipeline's caller is told ErrClosed before its call is abandoned.
// If it then calls Close itself (a deferred Close, a shutdown path), that
// Close must not return before the first is done: the abandon is still
// under way (here it waits for storeMu, held as a removal under way would).
func TestSecondCloseWaitsForCutPipeline(t *testing.T) {
	m := newMini(t)
	r, _, s, inPipe := pipelineOnItsWay(t, m, 1)
	r.storeMu.Lock() // the abandon cannot run until this is unlocked
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	require.ErrorIs(t, (<-inPipe).err, ErrClosed)
	again := make(chan struct{})
	go func() { r.Close(); close(again) }() // the caller's own Close
	select {
	case <-again:
		t.Errorf("a second Close returned before the cut call was abandoned (%d tombstones)", tombstones(m))
	case <-time.After(500 * time.Millisecond): // a bound on a wait that must not end
	}
	r.storeMu.Unlock()
	<-again
	<-closed
	assert.Equal(t, 1, tombstones(m), "abandoned once every Close has returned")
	s.Release()
}

// An Observer of the local registry that panics on the admission event
// (the local mirror is taken after Redis admitted) must not keep the lease
// in Redis for a TTL: as with a panic in Release, it is taken back.
func TestObserverPanicInAcquireRemovesLease(t *testing.T) {
	m := newMini(t)
	obs, boom := panickingObserver(slots.EventAcquired)
	r := m.registry(1, WithLeaseTTL(time.Minute), WithLocalOptions(slots.WithObserver(obs)))
	boom.Store(true)
	assert.Panics(t, func() { _, _ = r.TryAcquire("k") })
	boom.Store(false)
	eventually(t, "the lease is taken back from Redis", func() bool { return len(m.leases("k")) == 0 })
	assert.Zero(t, r.Stats().Held)
}

// panickingObserver returns an Observer that panics on events of kind
// while boom is set, as a broken metrics hook would.
func panickingObserver(kind slots.EventKind) (slots.Observer, *atomic.Bool) {
	boom := new(atomic.Bool)
	return slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == kind && boom.Load() {
			panic("metrics gone")
		}
	}), boom
}

// A caller not admitted after Redis admitted its lease (its context ended,
// or the Registry closed, as the local mirror was taken) has the lease
// given back: an Observer that panics on the release of the mirror must not
// keep the lease in Redis for a TTL.
func TestObserverPanicInGiveBackRemovesLease(t *testing.T) {
	for _, closing := range []bool{false, true} {
		name := "the caller's context ended"
		if closing {
			name = "the registry closed"
		}
		t.Run(name, func(t *testing.T) {
			m := newMini(t)
			var r *Registry[string]
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var boom atomic.Bool
			obs := slots.ObserverFunc(func(e slots.Event) {
				switch {
				case !boom.Load():
				case e.Kind == slots.EventAcquired && closing:
					r.Close()
				case e.Kind == slots.EventAcquired:
					cancel()
				case e.Kind == slots.EventReleased:
					panic("metrics gone")
				}
			})
			r = m.registry(1, WithLeaseTTL(time.Minute), WithLocalOptions(slots.WithObserver(obs)))
			boom.Store(true)
			assert.Panics(t, func() { _, _ = r.Acquire(ctx, "k") })
			boom.Store(false)
			eventually(t, "the lease is taken back from Redis", func() bool { return len(m.leases("k")) == 0 })
			assert.Zero(t, r.Stats().Held)
			if !closing {
				s, err := r.TryAcquire("k")
				require.NoError(t, err, "the cap has room")
				s.Release()
			}
		})
	}
}

// Releases after Close send nothing, start nothing and do not block: the
// leases expire after the TTL (goleak checks the goroutines at the end).
func TestReleaseAfterClose(t *testing.T) {
	m := newMini(t)
	r := New[string](redisstore.New(m.client(), "t"), 10000, WithLeaseTTL(3*time.Second))
	var held []*slots.Slot
	for range 50 {
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		held = append(held, s)
	}
	r.Close()
	for _, s := range held {
		s.Release()
	}
	assert.Zero(t, r.Stats().RemovalsPending)
	assert.Zero(t, r.Local().InFlight("k"), "the local mirror is released")
}
