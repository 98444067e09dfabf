package registry_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry"
)

// A key that admissions refuse as invalid reads as an idle key with no
// limit: InFlight, Waiting, Limit and Queue return zero values. Found by a
// bug hunt: on a key that cannot be hashed (an interface holding a slice)
// they panicked in the hash, while SetLimit and ClearLimit ignored it.
func TestReadsOfAnInvalidKey(t *testing.T) {
	reg := registry.New[any](2)
	for _, bad := range []any{[]int{1}, math.NaN()} {
		_, err := reg.TryAcquire(bad)
		require.ErrorIs(t, err, registry.ErrInvalidKey)
		assert.NotPanics(t, func() { reg.SetLimit(bad, 3) }, "SetLimit")
		assert.NotPanics(t, func() { reg.ClearLimit(bad) }, "ClearLimit")
		assert.NotPanics(t, func() { assert.Zero(t, reg.InFlight(bad)) }, "InFlight")
		assert.NotPanics(t, func() { assert.Zero(t, reg.Waiting(bad)) }, "Waiting")
		assert.NotPanics(t, func() { assert.Zero(t, reg.Queue(bad).Waiting) }, "Queue")
		assert.NotPanics(t, func() { assert.Zero(t, reg.Limit(bad)) }, "Limit")
	}
	assert.Zero(t, reg.Keys())
}
