package fleettest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/slots"
)

// oddKeys are keys a store may not keep as they are: bytes that are not
// UTF-8, NUL, text that looks like an encoding, keys as long as the fleet
// takes, and pairs of them that differ in one byte only.
var oddKeys = []string{
	"\xff", "\xfe",
	"a\x00b", "a\x00c",
	`\x`, `\x00`, `\x` + strings.Repeat("0", 64),
	strings.Repeat("k", registry.DefaultMaxKeyBytes),
	strings.Repeat("k", registry.DefaultMaxKeyBytes-1) + "j",
	"ключ {tag} %s '; --",
	"plain",
}

// Any key the fleet accepts is a key of its own on the store: each of
// oddKeys is capped at 1 across two processes without meeting the others,
// its leases are renewed beside ordinary ones (a TTL of 1.2 s, held for
// three), a waiter on it, in a flow whose name is no better, is handed its
// release, and none of it is a store error.
func anyKey(t *testing.T, srv Server) {
	ttl := fleet.WithLeaseTTL(1200 * time.Millisecond) // calls time out at 400 ms: 200 ms failed on busy machines
	a, b := process(t, srv, "anykey", 1, ttl), process(t, srv, "anykey", 1, ttl)
	held := make([]*slots.Slot, len(oddKeys))
	for i, k := range oddKeys {
		s, err := a.TryAcquire(k)
		require.NoError(t, err, "%.40q: its own key", k)
		held[i] = s
	}
	for _, k := range oddKeys {
		_, err := b.TryAcquire(k)
		require.ErrorIs(t, err, slots.ErrLimitReached, "%.40q: held in the other process", k)
	}
	for deadline := time.Now().Add(3600 * time.Millisecond); time.Now().Before(deadline); {
		for _, k := range oddKeys {
			n, err := b.InFlight(context.Background(), k)
			require.NoError(t, err)
			require.Equal(t, 1, n, "%.40q: the held lease is renewed", k)
		}
		time.Sleep(50 * time.Millisecond) // polling a real clock's renewals
	}

	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(slots.WithFlowWeight(context.Background(), "\xff\x00 flow", 2), 3*wait)
		defer cancel()
		s, err := b.Acquire(ctx, oddKeys[0])
		if err == nil {
			s.Release()
		}
		got <- err
	}()
	queuedIs(t, srv, "anykey", oddKeys[0], 1)
	for _, s := range held {
		s.Release()
	}
	require.NoError(t, <-got, "the waiter, handed the release")
	for _, k := range oddKeys {
		freedFor(t, b, k, "released")
	}
	for _, r := range []*fleet.Registry[string]{a, b} {
		st := r.Stats()
		// A key the store could not keep fails each of its calls: a store
		// error per key at least, renewal after renewal. A call that ran
		// past its timeout (a third of the TTL) on a loaded machine is one
		// error, of any key: seen in CI, four with a timeout of 200 ms.
		assert.Less(t, st.StoreErrors, uint64(3), "store errors")
		assert.Zero(t, st.Degraded, "admitted by the store, not locally")
		assert.Zero(t, st.Lost, "leases lost")
	}
}

// lookalikes are keys named as a store might name what it keeps beside a
// key ("k"): its name and a suffix after a separator, or a prefix before
// it. A store that builds its own names from a key's must keep them
// apart from every key's.
var lookalikes = []string{
	"k#w", "k#q", "k#t", "k#v", "k#u", "k#m", "k#g", "k#f0", "k#f1", "k#f2", "k##q", "#q",
	"k:", "k:q", "k|0", "k/q", "k.q", "abandoned:k", "abandoned:", "learn:k", "budget:k",
}

// keysNamedLikeAStoresOwn: each of lookalikes is a key of its own, capped
// at its limit across two processes, while "k" has a weighted holder and a
// heavy waiter queued, and none of it is a store error or touches "k": a
// TryAcquire of k's free unit is still refused for its waiter, who is
// handed its release.
func keysNamedLikeAStoresOwn(t *testing.T, srv Server) {
	a, b := process(t, srv, "lookalike", 4), process(t, srv, "lookalike", 4)
	held, err := a.TryAcquireN("k", 3)
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(slots.WithFlow(context.Background(), "x"), 3*wait)
		defer cancel()
		s, err := b.AcquireN(ctx, "k", 2)
		if err == nil {
			s.Release()
		}
		got <- err
	}()
	queuedIs(t, srv, "lookalike", "k", 1)
	for _, k := range lookalikes {
		var slots4 []*slots.Slot
		for i := range 4 {
			s, err := []*fleet.Registry[string]{a, b}[i%2].TryAcquire(k)
			require.NoError(t, err, "%q: a key of its own, %d held", k, i)
			require.False(t, s.Degraded(), "%q: admitted by the store", k)
			slots4 = append(slots4, s)
		}
		_, err := b.TryAcquire(k)
		require.ErrorIs(t, err, slots.ErrLimitReached, "%q: capped at 4 across the fleet", k)
		_, err = a.TryAcquire("k")
		require.ErrorIs(t, err, slots.ErrLimitReached, "%q: k's waiter keeps its place, and k its units", k)
		for _, s := range slots4 {
			s.Release()
		}
	}
	queuedIs(t, srv, "lookalike", "k", 1)
	held.Release()
	require.NoError(t, <-got, "k's waiter, handed the release")
	for _, r := range []*fleet.Registry[string]{a, b} {
		st := r.Stats()
		assert.Less(t, st.StoreErrors, uint64(3), "store errors") // one slow call on a loaded machine, as in anyKey
		assert.Zero(t, st.Degraded, "admitted by the store, not locally")
	}
}

// flowsNamedLikeAClasssCounts: a flow's bound counts its own waiters only,
// whatever its name: with one waiter each at most, a waiter of flow "x"
// does not fill the place of a flow named as x's count in a class might
// be kept ("1|x").
func flowsNamedLikeAClasssCounts(t *testing.T, srv Server) {
	a := process(t, srv, "lookalikeflow", 1, fleet.WithLocalOptions(slots.WithMaxQueuePerFlow(1)))
	b := process(t, srv, "lookalikeflow", 1, fleet.WithLocalOptions(slots.WithMaxQueuePerFlow(1)))
	held, err := a.TryAcquire("f")
	require.NoError(t, err)
	defer held.Release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waits := make(chan error, 8)
	wait := func(flow string) {
		go func() {
			s, err := b.Acquire(slots.WithFlow(ctx, flow), "f")
			if err == nil {
				s.Release()
			}
			waits <- err
		}()
	}
	wait("x")
	queuedIs(t, srv, "lookalikeflow", "f", 1)
	for i, flow := range []string{"0|x", "1|x", "2|x", "|x", "x|"} {
		wait(flow)
		queuedIs(t, srv, "lookalikeflow", "f", i+2)
	}
	select {
	case err := <-waits:
		t.Fatalf("a waiter of a flow of its own was refused: %v", err)
	default:
	}
	cancel()
	for range 6 {
		assert.ErrorIs(t, <-waits, context.Canceled)
	}
}
