package fleet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"

	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

func TestMain(m *testing.M) {
	redistest.Main(m, "registry/fleet")
}

// learnKey is the Redis key of r's learned state for key, and
// learnChannel the channel it is published on: r is on the Redis store,
// whose keys start with r.prefix, "<prefix>{<name>}:".
func learnKey[K comparable](r *Registry[K], key string) string {
	return strings.TrimSuffix(r.prefix, ":") + "#learn:" + key
}

func learnChannel[K comparable](r *Registry[K]) string {
	return strings.TrimSuffix(r.prefix, ":") + "#learned"
}

// loadScripts has the Redis server behind c load the store's scripts, as
// a first admission does: calls sent later run as EVALSHA at once.
func loadScripts(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	s := redisstore.New(c, "load-scripts")
	_, err := s.AdmitOne(context.Background(), &driver.AdmitCall{Lease: "load", Keys: []string{"k"}, Limits: []int{1}, TTL: time.Millisecond, Weight: 1, MaxQueue: -1, MaxFlowQueue: -1})
	require.NoError(t, err)
}
