package pacing_test

import (
	"context"
	"reflect"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

func TestGateNeverAdmitsAnEndedContext(t *testing.T) {
	g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, RequestsPerMinute: 60})
	_, err := g.Acquire(testrig.EndsOnLookup(), "m")
	assert.ErrorIs(t, err, context.Canceled)
	st := g.Status()
	assert.Zero(t, st.InFlight)
	assert.True(t, st.LastStart.IsZero(), "no start was charged")
	gt, err := g.Acquire(context.Background(), "m")
	require.NoError(t, err, "the pacing interval was not taken by the caller that gave up")
	gt.Slot.Release()
}

// Waiting Acquires read the wait policy while Reconfigure changes it: under
// -race this was a data race on the Gate's config. (Not in a synctest
// bubble: its Wait orders the goroutines and would hide the race.)
func TestGateReconfigureRacesWaiters(t *testing.T) {
	cfg := pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 1, OnWaitTimeout: "reject"}
	g := newGate(t, cfg)
	held, err := g.Acquire(context.Background(), "m")
	require.NoError(t, err)
	defer held.Slot.Release()
	stop := make(chan struct{})
	reconfigured := make(chan struct{})
	go func() {
		defer close(reconfigured)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			c := cfg
			if i%2 == 0 {
				c.OnWaitTimeout = "proceed"
			}
			assert.NoError(t, g.Reconfigure(c))
		}
	}()
	for range 50 {
		gt, err := g.Acquire(context.Background(), "m") // waits 1 ms, then one policy or the other
		if err != nil {
			assert.ErrorIs(t, err, slots.ErrWaitTimeout)
			continue
		}
		assert.True(t, gt.Slot.Bypassed())
		gt.Slot.Release()
	}
	close(stop)
	<-reconfigured
}

// The wait policy in force when a wait ends is the one applied.
func TestGateReconfigureWhileWaiting(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 1000, OnWaitTimeout: "reject"}
		g := newGate(t, cfg)
		held, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		waiter := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		cfg.OnWaitTimeout = "proceed"
		cfg.MaxQueueWaitMS = 5000
		require.NoError(t, g.Reconfigure(cfg))
		time.Sleep(time.Second) // fake time: the wait's maximum passes
		r := <-waiter
		require.NoError(t, r.err, "the policy at the end of the wait applies: proceed")
		assert.True(t, r.g.Slot.Bypassed())
		r.g.Slot.Release()
		held.Slot.Release()
	})
}

func TestGateCopiedSlotFreesNothing(t *testing.T) {
	g := newGate(t, pacing.Config{MaxConcurrentRequests: 1})
	gt, err := g.Acquire(context.Background(), "m")
	require.NoError(t, err)
	c := new(slots.Slot)
	reflect.ValueOf(c).Elem().Set(reflect.ValueOf(gt.Slot).Elem()) // a copy, as careless code makes one
	assert.False(t, c.Release(), "the copy freed nothing")
	st := g.Status()
	assert.Equal(t, 1, st.InFlight)
	assert.Equal(t, uint64(1), st.DoubleReleases)
	assert.True(t, gt.Slot.Release())
	assert.Zero(t, g.Status().InFlight)
}
