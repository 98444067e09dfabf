package registry_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// An Observer that panics on an admission does not keep the capacity: the
// Slot never reaches its caller, so it is released.
func TestObserverPanicOnAdmissionKeepsNothing(t *testing.T) {
	var armed atomic.Bool
	obs := slots.ObserverFunc(func(e slots.Event) {
		if armed.Load() && e.Kind == slots.EventAcquired {
			panic("observer")
		}
	})
	reg := registry.New[string](1, slots.WithObserver(obs))
	armed.Store(true)
	for _, acquire := range []func() (*slots.Slot, error){
		func() (*slots.Slot, error) { return reg.TryAcquire("a") },
		func() (*slots.Slot, error) { return reg.Acquire(context.Background(), "a") },
		func() (*slots.Slot, error) { return reg.AcquireAll(context.Background(), "a", "b") },
	} {
		assert.PanicsWithValue(t, "observer", func() { _, _ = acquire() })
		assert.Zero(t, reg.Keys())
	}
}

// TestObserverNeverUnderLock: releasing a copied multi-key slot is misuse;
// the Observer hears of it with no registry lock held, so it may call back.
func TestObserverNeverUnderLock(t *testing.T) {
	var reg *registry.Registry[string]
	var calledBack atomic.Int32
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind != slots.EventDoubleRelease {
			return
		}
		done := make(chan struct{})
		go func() { reg.Stats(); close(done) }()
		select {
		case <-done:
			calledBack.Add(1)
		case <-time.After(5 * time.Second):
			t.Error("the Observer was called with registry locks held")
		}
	})
	reg = registry.New[string](1, slots.WithObserver(obs), slots.WithLogger(quiet))
	m, err := reg.TryAcquireAll("p", "q")
	require.NoError(t, err)
	copySlot(m).Release()
	assert.Equal(t, int32(1), calledBack.Load())
	assert.Equal(t, 1, reg.InFlight("p"), "the copy freed nothing")
	m.Release()
	assert.Equal(t, 0, reg.Keys())
}

func TestEveryAttemptEndsInOneEvent(t *testing.T) {
	var rejected atomic.Int32
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventRejected {
			rejected.Add(1)
		}
	})
	reg := registry.New[string](1, slots.WithObserver(obs))
	_, err := reg.AcquireAll(context.Background())
	assert.ErrorIs(t, err, registry.ErrNoKeys)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = reg.Acquire(ctx, "k")
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, int32(2), rejected.Load())

	reg.SetLimit(strings.Repeat("x", registry.DefaultMaxKeyBytes+1), 3)
	reg.ClearLimit(strings.Repeat("x", registry.DefaultMaxKeyBytes+1))
	assert.Equal(t, int32(2), rejected.Load(), "limits set on a bad key are no rejections")
	assert.Equal(t, uint64(0), reg.Stats().InvalidKeys)
}
