package pacing_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
)

// The provider's one queue is told apart by model: each waiter counts for
// its own model until it is granted, withdrawn or turned away.
func TestStatusWaitingByModel(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 2, MaxQueue: 3,
			Models: map[string]pacing.ModelConfig{"glm-5.3": {MaxConcurrentRequests: 1}}})
		defer g.Close()
		ctx := context.Background()
		a, err := g.Acquire(ctx, "glm-5.3")
		require.NoError(t, err)
		b, err := g.Acquire(ctx, "glm-4")
		require.NoError(t, err)
		assert.Empty(t, g.Status().WaitingByModel, "nobody waits while there is room")

		leaving, leave := context.WithCancel(ctx)
		first := acquireAsync(leaving, g, "glm-5.3")
		second := acquireAsync(ctx, g, "glm-5.3")
		other := acquireAsync(ctx, g, "glm-4")
		synctest.Wait()
		st := g.Status()
		assert.Equal(t, 3, st.Queued)
		assert.Equal(t, map[string]int{"glm-5.3": 2, "glm-4": 1}, st.WaitingByModel)

		_, err = g.Acquire(ctx, "glm-6")
		require.Error(t, err, "the queue is full")
		assert.Equal(t, map[string]int{"glm-5.3": 2, "glm-4": 1}, g.Status().WaitingByModel, "a request turned away does not count")

		b.Slot.Release()
		r := <-other
		require.NoError(t, r.err, "glm-4's waiter is not held up by glm-5.3's cap")
		assert.Equal(t, map[string]int{"glm-5.3": 2}, g.Status().WaitingByModel)

		leave()
		require.Error(t, (<-first).err)
		assert.Equal(t, map[string]int{"glm-5.3": 1}, g.Status().WaitingByModel, "a withdrawn waiter does not count")

		a.Slot.Release()
		r2 := <-second
		require.NoError(t, r2.err)
		assert.Empty(t, g.Status().WaitingByModel)
		r.g.Slot.Release()
		r2.g.Slot.Release()
	})
}

// A key taken out of the pool stays in ByKey while requests on it are in
// flight, so that ByKey sums to InFlight, and leaves it once they end.
// Found by a bug hunt: it left at once, its requests counted only in
// InFlight.
func TestStatusByKeyOfAKeyTakenOut(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		with := pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k", MaxConcurrentRequests: 1}, {ID: "j", MaxConcurrentRequests: 1}}}
		without := pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "j", MaxConcurrentRequests: 1}}}
		g := newGate(t, with)
		defer g.Close()
		a, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		require.Equal(t, "k", a.Key)
		require.NoError(t, g.Reconfigure(without))
		st := g.Status()
		assert.Equal(t, 1, st.InFlight)
		assert.Equal(t, map[string]int{"k": 1, "j": 0}, st.ByKey, "k's request still in flight")
		a.Slot.Release()
		assert.Equal(t, map[string]int{"j": 0}, g.Status().ByKey, "k gone once its request ended")
	})
}

// NextStartIn counts down to the provider's next start that its spacing
// allows, and is 0 (not negative) once that has come.
func TestStatusNextStartIn(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MinIntervalMS: 100})
		defer g.Close()
		assert.Zero(t, g.Status().NextStartIn, "no start yet")
		a, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		defer a.Slot.Release()
		assert.Equal(t, 100*time.Millisecond, g.Status().NextStartIn)
		time.Sleep(40 * time.Millisecond) // the bubble's clock
		assert.Equal(t, 60*time.Millisecond, g.Status().NextStartIn)
		time.Sleep(time.Second)
		assert.Zero(t, g.Status().NextStartIn, "past due")
	})
}
