package registry_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
)

// A copy of a Slot is misuse: releasing it frees nothing and reports false.
func TestReleasingACopyFreesNothing(t *testing.T) {
	for _, keys := range [][]string{{"a"}, {"a", "b"}} {
		reg := registry.New[string](1, registry.WithLogger(quiet))
		s, err := reg.TryAcquireAll(keys...)
		require.NoError(t, err)
		assert.False(t, copySlot(s).Release(), "%d key(s): the copy freed nothing", len(keys))
		assert.Equal(t, 1, reg.InFlight("a"))
		assert.Equal(t, uint64(1), reg.Stats().DoubleReleases)
		assert.True(t, s.Release())
		assert.Zero(t, reg.Keys())
	}
}
