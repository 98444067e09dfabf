package fleet

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// A key admissions refuse (unequal to itself, or not comparable) is
// ignored by every method that takes one: Limit reads 0 and Forget does
// nothing. Found by a review: Limit and Forget panicked on a key that
// cannot be hashed.
func TestMethodsOfAnInvalidKey(t *testing.T) {
	r := New[any](memstore.New(), 2)
	defer r.Close()
	for _, bad := range []any{math.NaN(), []int{1}} {
		assert.NotPanics(t, func() { r.SetLimit(bad, 3) }, "SetLimit %v", bad)
		assert.NotPanics(t, func() { r.ClearLimit(bad) }, "ClearLimit %v", bad)
		assert.NotPanics(t, func() { _, _ = r.InFlight(context.Background(), bad) }, "InFlight %v", bad)
		assert.NotPanics(t, func() { assert.Zero(t, r.Limit(bad)) }, "Limit %v", bad)
		assert.NotPanics(t, func() { r.Forget(bad) }, "Forget %v", bad)
		assert.NotPanics(t, func() { _ = r.Learned(bad) }, "Learned %v", bad)
	}
}
