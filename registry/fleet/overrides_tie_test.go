package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// Two records of one version with different limits: a process whose copy
// is one and whose read finds the other takes the store's, the one every
// other process reads, rather than keep its own for good. It happens after
// a failover to a replica that lagged while the versions ran ahead of the
// clocks (a process whose clock was an hour ahead wrote the record before):
// a's change, made on the old primary, was lost; c, which had not seen it,
// made another on the new primary under the same version (the one after
// the record both read). a used to keep {x:1} and c {y:2}: every gateway
// of a's applied x's limit and not y's, until the next change.
func TestOverridesSameVersionOtherLimitsTakesTheStores(t *testing.T) {
	ctx := context.Background()
	ms := memstore.New()
	key := overridesPrefix + "orgs"
	ahead := uint64(time.Now().Add(time.Hour).UnixMicro()) // written by a clock an hour ahead
	plant := func() {
		res, err := ms.SyncLearned(ctx, &driver.LearnedCall{Key: key, Presumed: "-",
			State: fmt.Sprintf(`{"v":%d,"k":"\u0000overrides/orgs","f":1}`, ahead), TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, res.Wrote)
	}
	plant()
	fa := &flakyStore{Store: ms}
	a, err := NewOverrides(fa, "orgs", nil, nil)
	require.NoError(t, err)
	defer a.Close()
	fc := &flakyStore{Store: ms}
	c, err := NewOverrides(fc, "orgs", nil, nil)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, a.Sync(ctx))
	require.NoError(t, c.Sync(ctx))

	fc.cut.Store(true) // c does not see a's change
	require.NoError(t, a.Set(ctx, "x", 1))
	fa.cut.Store(true) // a does not read the new primary until the test says
	// The failover: the new primary has the record as it was before a's change.
	ms.Kill()
	ms.Restart()
	plant()
	fc.cut.Store(false)
	require.NoError(t, c.Set(ctx, "y", 2))
	fa.cut.Store(false)

	require.NoError(t, a.Sync(ctx))
	require.NoError(t, c.Sync(ctx))
	assert.Equal(t, c.All(), a.All(), "every process holds the same overrides")
	assert.Equal(t, map[string]int{"y": 2}, a.All(), "the store's")
}
