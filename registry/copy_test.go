package registry_test

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
)

// A copy of a Slot is misuse: releasing it frees nothing and reports false.
func TestReleasingACopyFreesNothing(t *testing.T) {
	for _, keys := range [][]string{{"a"}, {"a", "b"}} {
		reg := registry.New[string](1, slots.WithLogger(quiet))
		s, err := reg.TryAcquireAll(keys...)
		require.NoError(t, err)
		assert.False(t, copySlot(s).Release(), "%d key(s): the copy freed nothing", len(keys))
		assert.Equal(t, 1, reg.InFlight("a"))
		assert.Equal(t, uint64(1), reg.Stats().DoubleReleases)
		assert.True(t, s.Release())
		assert.Zero(t, reg.Keys())
	}
}

// copySlot copies a Slot the way careless code would (go vet flags a plain
// copy, so reflection stands in for it).
func copySlot(s *slots.Slot) *slots.Slot {
	c := new(slots.Slot)
	reflect.ValueOf(c).Elem().Set(reflect.ValueOf(s).Elem())
	return c
}
