package slots_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/slots"
)

func TestCombine(t *testing.T) {
	a, b := slots.NewLimiter(1), slots.NewLimiter(1)
	sa, err := a.TryAcquire()
	require.NoError(t, err)
	sb, err := b.TryAcquire()
	require.NoError(t, err)
	c := slots.Combine(sa, nil, sb)
	assert.False(t, c.Bypassed())
	assert.False(t, c.Degraded())
	assert.False(t, c.AcquiredAt().IsZero())
	assert.True(t, c.Release())
	assert.False(t, c.Release(), "released once")
	assert.True(t, sa.Released())
	assert.True(t, sb.Released())
	assert.Zero(t, a.InFlight()+b.InFlight())
	assert.Zero(t, a.Stats().DoubleReleases, "the parts are released once")
	assert.Nil(t, slots.Combine(nil, nil))

	// A part already released by its owner is not released again.
	sa, _ = a.TryAcquire()
	sb, _ = b.TryAcquire()
	c = slots.Combine(sa, sb)
	sa.Release()
	c.Release()
	assert.Zero(t, a.Stats().DoubleReleases)
	assert.Zero(t, b.InFlight())
}

// A Combine slot weighs what its largest part weighs: one request held at
// a cap counting 3 units and at one counting 5.
func TestCombineUnits(t *testing.T) {
	a, b := slots.NewLimiter(10), slots.NewLimiter(10)
	sa, err := a.TryAcquireN(3)
	require.NoError(t, err)
	sb, err := b.TryAcquireN(5)
	require.NoError(t, err)
	c := slots.Combine(sa, sb)
	assert.Equal(t, 5, c.Units())
	c.Release()
	assert.Zero(t, a.InFlight()+b.InFlight())
}
