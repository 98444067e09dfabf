package registry_test

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
)

// Keys that a map can never find again must be refused: a NaN admitted as a
// key would get a fresh lane on every acquire, and the cap would not hold.
func TestRegistryKeysUnequalToThemselves(t *testing.T) {
	t.Run("NaN", func(t *testing.T) {
		reg := registry.New[float64](1)
		_, err := reg.TryAcquire(math.NaN())
		assert.ErrorIs(t, err, registry.ErrInvalidKey)
		_, err = reg.AcquireAll(context.Background(), 1.5, math.NaN())
		assert.ErrorIs(t, err, registry.ErrInvalidKey)
		reg.SetLimit(math.NaN(), 5)
		reg.ClearLimit(math.NaN())
		assert.Equal(t, 0, reg.Keys())
		s, err := reg.TryAcquire(1.5)
		require.NoError(t, err, "ordinary floats are fine")
		s.Release()
	})
	t.Run("a struct holding a NaN", func(t *testing.T) {
		type key struct {
			org    string
			weight float64
		}
		reg := registry.New[key](1)
		_, err := reg.TryAcquire(key{"a", math.NaN()})
		assert.ErrorIs(t, err, registry.ErrInvalidKey)
	})
	t.Run("an interface holding an uncomparable value", func(t *testing.T) {
		reg := registry.New[any](1)
		_, err := reg.TryAcquire([]int{1})
		assert.ErrorIs(t, err, registry.ErrInvalidKey, "no panic deep inside")
		s, err := reg.TryAcquire("fine")
		require.NoError(t, err)
		s.Release()
		assert.Equal(t, 0, reg.Keys())
	})
}
