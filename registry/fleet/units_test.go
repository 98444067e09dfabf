package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/slots/slotstest"
)

// countIs waits until the store counts n units on key.
func countIs(t *testing.T, ms *memstore.Store, key string, n int, what string) {
	t.Helper()
	var last int
	require.Eventually(t, func() bool {
		got, err := ms.Count(context.Background(), key)
		last = got
		return err == nil && got == n
	}, 10*time.Second, time.Millisecond, "%s: %d units wanted, last counted %d", what, n, last)
}

// A lease of several units admitted while the store is down (under the
// local cap) goes into the store with its units once it answers: by the
// heartbeat, or carried by the next admission on its key.
func TestUnitsDegradedGoBackWithTheirUnits(t *testing.T) {
	ms := memstore.New()
	r := New[string](ms, 10, WithBreaker(1, 20*time.Millisecond), WithUnavailable(FallbackLocal),
		WithLeaseTTL(600*time.Millisecond), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	warm, err := r.TryAcquire("k") // r knows the store's epoch
	require.NoError(t, err)
	warm.Release()
	countIs(t, ms, "k", 0, "the warm-up released")

	ms.Kill()
	s, err := r.TryAcquireN("k", 4)
	require.NoError(t, err)
	assert.True(t, s.Degraded(), "admitted under the local cap")
	assert.Equal(t, 4, s.Units())
	_, err = r.TryAcquireN("k", 7)
	require.ErrorIs(t, err, slots.ErrLimitReached, "the local cap counts units too: 4 + 7 over 10")
	ms.Restart()

	countIs(t, ms, "k", 4, "the degraded lease put back with its units")
	var s2 *slots.Slot
	require.Eventually(t, func() bool {
		s2, err = r.TryAcquireN("k", 6)
		if err == nil && s2.Degraded() {
			s2.Release() // the breaker opened again: not what this waits for
			return false
		}
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "6 more in the store once its pause ends")
	countIs(t, ms, "k", 10, "4 + 6")
	_, err = r.TryAcquire("k")
	require.ErrorIs(t, err, slots.ErrLimitReached)
	s.Release()
	s2.Release()
	countIs(t, ms, "k", 0, "every unit released")
	assert.Equal(t, 0, r.local.InFlight("k"), "the local mirror freed its units")
}

// A store that loses its data gets a holder's lease back with its units
// from the next renewal, and new admissions wait for it (the pause).
func TestUnitsLostAndReasserted(t *testing.T) {
	ms := memstore.New()
	r := New[string](ms, 10, WithLeaseTTL(600*time.Millisecond), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	s, err := r.TryAcquireN("k", 6)
	require.NoError(t, err)
	countIs(t, ms, "k", 6, "admitted")
	ms.Lose()
	countIs(t, ms, "k", 6, "put back by the renewal")
	require.Eventually(t, func() bool {
		x, err := r.TryAcquireN("k", 4)
		if err == nil {
			x.Release()
		}
		return err == nil
	}, 10*time.Second, 5*time.Millisecond, "4 more fit once the pause ends")
	_, err = r.TryAcquireN("k", 5)
	require.ErrorIs(t, err, slots.ErrLimitReached, "6 + 5 over 10")
	s.Release()
	countIs(t, ms, "k", 0, "released")
}

// The Observer is told an admission's units and its release's; a weight
// out of range is told before a nil context, as the local registry tells
// it.
func TestUnitsObserved(t *testing.T) {
	ms := memstore.New()
	o := &slotstest.Recorder{}
	r := New[string](ms, 10, WithObserver(o), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	s, err := r.AcquireAllN(context.Background(), 3, "a", "b")
	require.NoError(t, err)
	assert.Equal(t, 3, s.Units())
	s.Release()
	//nolint:staticcheck // a nil context on purpose
	_, err = r.AcquireN(nil, "a", 0)
	require.ErrorIs(t, err, slots.ErrBadUnits)
	_, err = r.TryAcquireN("a", slots.MaxUnits+1)
	require.ErrorIs(t, err, slots.ErrBadUnits)
	events := o.Events()
	require.Len(t, events, 4)
	assert.Equal(t, slots.EventAcquired, events[0].Kind)
	assert.Equal(t, 3, events[0].Units)
	assert.Equal(t, slots.EventReleased, events[1].Kind)
	assert.Equal(t, 3, events[1].Units)
	for _, e := range events[2:] {
		assert.Equal(t, slots.EventRejected, e.Kind)
		assert.ErrorIs(t, e.Err, slots.ErrBadUnits)
	}
	assert.Equal(t, uint64(2), r.Stats().Rejected)
}

// While the store is down, a weight the local caps can never hold (a
// share reserved for another class leaves 5 of 10) fails at once with
// slots.ErrExceedsLimit, as the store's refusal would, rather than wait
// for room that cannot come; a FailOpen bypass weighs what was asked.
func TestUnitsWhileTheStoreIsDown(t *testing.T) {
	ms := memstore.New()
	r := New[string](ms, 10, WithBreaker(1, time.Hour), WithUnavailable(FallbackLocal), WithLogger(quiet()),
		WithLocalOptions(slots.WithShare(slots.PriorityBatch, slots.Share{Reserved: 5})))
	t.Cleanup(func() { closeWithin(t, r) })
	ms.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := r.AcquireN(ctx, "k", 8)
	require.ErrorIs(t, err, slots.ErrExceedsLimit)
	assert.Less(t, time.Since(start), 30*time.Second, "refused, not left to wait for its context")

	open := New[string](ms, 10, WithBreaker(1, time.Hour), WithUnavailable(FailOpen), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, open) })
	s, err := open.TryAcquireN("k", 3)
	require.NoError(t, err)
	assert.True(t, s.Bypassed())
	assert.Equal(t, 3, s.Units(), "a bypass weighs what was asked")
	s.Release()
}
