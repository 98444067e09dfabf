package fleettest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// Two processes, a limit of 1, 100 concurrent acquires: at most one holds
// at any instant (an independent counter), and every acquire is admitted
// in turn, by the store. Its calls may take up to slowCalls: on two busy
// cores under the race detector, 100 calls at once to a real server took
// longer than the default 500 ms now and then, and a call that times out
// is a store error, which this test counts.
func atMostOneActive(t *testing.T, srv Server) {
	rs := processes(t, srv, "one", 2, 1, fleet.WithTimeout(slowCalls))
	var active, peak, admitted atomic.Int32
	var wg sync.WaitGroup
	for i := range 100 {
		r := rs[i%2]
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 6*wait)
			defer cancel()
			s, err := r.Acquire(ctx, "k")
			if !assert.NoError(t, err) {
				return
			}
			n := active.Add(1)
			raise(&peak, n)
			admitted.Add(1)
			time.Sleep(2 * time.Millisecond) // the held request's work: a second holder would overlap it
			active.Add(-1)
			s.Release()
		})
	}
	wg.Wait()
	assert.Equal(t, int32(100), admitted.Load())
	assert.Equal(t, int32(1), peak.Load(), "holders at once")
	for _, r := range rs {
		st := r.Stats()
		assert.Zero(t, st.Degraded, "admitted by the store, not locally")
		assert.Zero(t, st.StoreErrors, "store errors")
	}
}

// slowCalls bounds the store's calls in the tests that count its errors,
// and in those of an exact order (a waiter whose call times out asks again
// under a new ticket, behind its class: its call may have run): long
// enough for a loaded machine, within a third of the lease TTL.
const slowCalls = 5 * time.Second

// A full key refuses TryAcquire with a LimitError naming it; a release
// frees it for the other process.
func fullAndRelease(t *testing.T, srv Server) {
	rs := processes(t, srv, "full", 2, 2)
	a, b := rs[0], rs[1]
	s1, err := a.TryAcquire("k")
	require.NoError(t, err)
	s2, err := b.TryAcquire("k")
	require.NoError(t, err)
	_, err = a.TryAcquire("k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.True(t, errors.Is(err, slots.ErrLimitReached))
	assert.Equal(t, "k", le.Key)
	assert.Equal(t, 2, le.InFlight)
	n, err := a.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	s1.Release()
	freedFor(t, b, "k", "the release reaches the store")
	s2.Release()
}

// A waiter in one process is handed the slot that a holder in another
// releases: by the release's grant and its wake-up, the only way its store
// lets it in (grantsOnly: its own asks are not sent once it is queued).
func handOff(t *testing.T, srv Server) {
	holder, waiter, store := heldAgainst(t, srv, "hand")
	s, err := holder.TryAcquire("k")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		w, err := waiter.Acquire(ctx, "k")
		if err == nil {
			w.Release()
		}
		got <- err
	}()
	queuedIs(t, srv, "hand", "k", 1)
	s.Release()
	require.NoError(t, <-got, "handed the slot by the release")
	assert.Positive(t, store.grants.Load(), "a grant delivered by Listen")
}

// Leases are renewed while held (a TTL of 1.5 s, held for 4 s), and
// those of a process that stops renewing expire on the store's clock.
func renewAndExpiry(t *testing.T, srv Server) {
	ttl := fleet.WithLeaseTTL(1500 * time.Millisecond)
	a, b := process(t, srv, "renew", 2, ttl), process(t, srv, "renew", 2, ttl)
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	for deadline := time.Now().Add(4 * time.Second); time.Now().Before(deadline); {
		n, err := b.InFlight(context.Background(), "k")
		require.NoError(t, err)
		require.Equal(t, 1, n, "the held lease is renewed")
		time.Sleep(20 * time.Millisecond) // polling a real clock's renewals
	}
	assert.Zero(t, a.Stats().Lost)
	s.Release()
	gone, err := b.TryAcquire("k")
	require.NoError(t, err)
	b.Close() // its lease is not released: it expires
	inFlightIs(t, a, "k", 0, "a lease nobody renews expires")
	gone.Release() // after Close: nothing to send
}

// AcquireAll takes a lease on every key or none, across processes: with a
// provider key of 2 and a model key of 1, a second holder of the model is
// refused on it, and a holder of another model is not.
func acquireAll(t *testing.T, srv Server) {
	keys := fleet.Keys[string]{Limit: func(k string) int {
		if k == "provider" {
			return 2
		}
		return 1
	}}
	var rs []*fleet.Registry[string]
	for range 2 {
		r := fleet.NewWithKeys(srv.Store(t, "all"), 1, keys)
		t.Cleanup(r.Close)
		rs = append(rs, r)
	}
	a, b := rs[0], rs[1]
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
// to it (its process is told of no grant), and the key is free for a
// newcomer.
func waiterGivesUp(t *testing.T, srv Server) {
	holder, waiter, store := heldAgainst(t, srv, "giveup")
	s, err := holder.TryAcquire("k")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(ctx, "k")
		done <- err
	}()
	queuedIs(t, srv, "giveup", "k", 1)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	queuedIs(t, srv, "giveup", "k", 0)
	s.Release()
	// A grant to the waiter that left would hold the key for a claim
	// window, and its wake-up would have come long before the key frees.
	freedFor(t, holder, "k", "the release reaches the store")
	assert.Zero(t, store.grants.Load(), "a grant to a waiter that left")
}

// A limit changed while held: lowered, it admits nothing until the
// holders are fewer than it; raised, it admits at once, in every process.
func liveLimits(t *testing.T, srv Server) {
	rs := processes(t, srv, "limits", 2, 3)
	a, b := rs[0], rs[1]
	var held []*slots.Slot
	for range 3 {
		s, err := a.TryAcquire("k")
		require.NoError(t, err)
		held = append(held, s)
	}
	for _, r := range rs {
		r.SetLimit("k", 1)
	}
	held[0].Release()
	held[1].Release()
	inFlightIs(t, b, "k", 1, "two released")
	_, err := b.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached, "one held, under a limit of 1")
	held[2].Release()
	inFlightIs(t, b, "k", 0, "none held")
	for _, r := range rs {
		r.SetLimit("k", 2)
	}
	s1, err := b.TryAcquire("k")
	require.NoError(t, err)
	s2, err := a.TryAcquire("k")
	require.NoError(t, err, "raised to 2")
	_, err = a.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached)
	s1.Release()
	s2.Release()
}

// A cut reported in one process reaches the other through the learned
// state the store keeps and publishes.
func learnedCapShared(t *testing.T, srv Server) {
	rs := processes(t, srv, "learn", 2, 100)
	for _, r := range rs {
		require.NoError(t, r.Learn("p", upstream.AdaptiveConfig{Initial: 10}))
	}
	var held []*slots.Slot
	for range 5 {
		s, err := rs[0].TryAcquire("p")
		require.NoError(t, err)
		held = append(held, s)
	}
	rs[0].Report(held[4], upstream.Verdict{Kind: upstream.Concurrency})
	require.Eventually(t, func() bool { return rs[1].Learned("p").Cap == 4 }, wait, 5*time.Millisecond, "the other process learns the cut")
	for _, s := range held {
		s.Release()
	}
}
