package registry_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"

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
	reg := registry.New[string](1, registry.WithObserver(obs))
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
