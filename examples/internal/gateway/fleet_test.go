package gateway

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Redis client's reads and writes end at the fleet's timeout
// (timeout_ms), not before: go-redis ends each at the sooner of its own
// timeout and the call's deadline. With 250 ms set on the client, a
// timeout_ms of 750 still ended every call at 250 ms.
func TestFleetRedisClientFollowsTheTimeout(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"upstream":"http://x","fleet":{"redis_url":"redis://127.0.0.1:1","timeout_ms":750}}`))
	require.NoError(t, err)
	g := &Gateway{}
	_, _, err = g.fleetStores(cfg)
	require.NoError(t, err)
	defer g.rdb.Close()
	assert.Equal(t, 750*time.Millisecond, g.rdb.Options().ReadTimeout)
	assert.Equal(t, 750*time.Millisecond, g.rdb.Options().WriteTimeout)
}
