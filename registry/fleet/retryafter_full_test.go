package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A key at its limit tells a Retry-After from how long holders keep their
// slots, not from when the earliest lease would expire: with holds of a
// few microseconds and leases of 30 s, a refused caller is told to come
// back in milliseconds (it was told 30 s).
func TestFullKeyRetryAfterFollowsHolds(t *testing.T) {
	r := New[string](memstore.New(), 1)
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound on a hang
	defer cancel()
	for range 20 { // holds of about nothing: the estimate warms up
		s, err := r.Acquire(ctx, "k") // a release reaches the store in the background
		require.NoError(t, err)
		s.Release()
	}
	s, err := r.Acquire(ctx, "k")
	require.NoError(t, err)
	defer s.Release()
	_, err = r.TryAcquire("k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Positive(t, le.RetryAfter)
	assert.Less(t, le.RetryAfter, time.Second, "a hold's time, not the lease TTL's (%v)", DefaultLeaseTTL)
}
