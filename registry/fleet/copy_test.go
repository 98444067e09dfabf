package fleet

import (
	"context"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

// A copy of a fleet Slot is misuse: releasing it frees nothing, neither in
// Redis nor in the local mirror, and reports false.
func TestReleasingACopyFreesNothing(t *testing.T) {
	m := newMini(t)
	r := m.registry(1)
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	c := new(slots.Slot)
	reflect.ValueOf(c).Elem().Set(reflect.ValueOf(s).Elem()) // a copy, as careless code makes one
	assert.False(t, c.Release(), "the copy freed nothing")
	assert.Equal(t, uint64(1), r.Stats().DoubleReleases)
	n, err := r.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the lease is still in Redis")
	_, err = r.TryAcquire("k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the original still holds the cap")
	assert.True(t, s.Release())
	eventually(t, "the lease is removed", func() bool { return len(m.leases("k")) == 0 })
}
