package fleet

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// On a Redis Cluster of three masters, two Registries whose keys live on
// different nodes hold their caps under concurrent load (pipelines and
// multi-key scripts included): each key's script runs on the node of its
// Registry's hash tag. Leases are renewed past their TTL, and all are
// removed at the end. Calls get a second (the longest a TTL of 3 s
// allows): a reply that a busy machine delays is not an unavailable Redis.
// Whether any admission went without Redis all the same is logged, not
// asserted: each name has one process here, so its local caps are the
// fleet's, and the caps hold either way.
func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	c := cl.Client()
	// "{providers}" and "{tenants}" hash to slots served by different nodes.
	nodeOf := func(tag string) string {
		slot, err := c.ClusterKeySlot(ctx, "{"+tag+"}").Result()
		require.NoError(t, err)
		return cl.Nodes[int(slot)*len(cl.Nodes)/16384].Addr
	}
	require.NotEqual(t, nodeOf("providers"), nodeOf("tenants"))

	const ttl = 3 * time.Second
	patient := func() *redis.ClusterClient {
		addrs := make([]string, len(cl.Nodes))
		for i, n := range cl.Nodes {
			addrs[i] = n.Addr
		}
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, Protocol: 2})
		t.Cleanup(func() { c.Close() })
		return c
	}
	providers := New[string](redisstore.New(patient(), "providers"), 4, WithLeaseTTL(ttl), WithTimeout(ttl/3))
	defer providers.Close()
	providers.SetLimit("zai/glm-5", 2)
	orgs := New[string](redisstore.New(patient(), "tenants"), 3, WithLeaseTTL(ttl), WithTimeout(ttl/3))
	defer orgs.Close()

	var provider, model, org, peakProvider, peakModel, peakOrg atomic.Int64
	up := func(n, peak *atomic.Int64) {
		v := n.Add(1)
		for p := peak.Load(); v > p && !peak.CompareAndSwap(p, v); p = peak.Load() {
		}
	}
	var wg sync.WaitGroup
	var failures, degraded atomic.Int64
	for range 32 {
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			for range 20 {
				p, err := providers.AcquireAll(wctx, "zai", "zai/glm-5")
				if err != nil {
					failures.Add(1)
					return
				}
				up(&provider, &peakProvider)
				up(&model, &peakModel)
				if p.Degraded() {
					degraded.Add(1)
				}
				time.Sleep(500 * time.Microsecond) // the request's work
				model.Add(-1)
				provider.Add(-1)
				p.Release()

				o, err := orgs.Acquire(wctx, "acme")
				if err != nil {
					failures.Add(1)
					return
				}
				up(&org, &peakOrg)
				// Long enough for the hand-offs of the queue (a wake-up and
				// a claim, a round trip each) to fill the cap.
				time.Sleep(5 * time.Millisecond)
				org.Add(-1)
				o.Release()
			}
		})
	}
	wg.Wait()
	require.Zero(t, failures.Load())
	assert.LessOrEqual(t, peakOrg.Load(), int64(3))
	assert.LessOrEqual(t, peakProvider.Load(), int64(4))
	assert.LessOrEqual(t, peakModel.Load(), int64(2))
	assert.Equal(t, int64(2), peakModel.Load(), "the model cap was reached")
	assert.Equal(t, int64(3), peakOrg.Load(), "the org cap was reached")

	// A lease held past its TTL is renewed on its node.
	s, err := providers.TryAcquire("zai")
	require.NoError(t, err)
	deadline := time.Now().Add(ttl + ttl/3)
	for time.Now().Before(deadline) {
		n, err := providers.InFlight(ctx, "zai")
		require.NoError(t, err)
		require.Equal(t, 1, n, "renewed, never expired")
		time.Sleep(ttl / 10) // watching the lease over time
	}
	s.Release()

	for _, k := range []struct {
		r   *Registry[string]
		key string
	}{{providers, "zai"}, {providers, "zai/glm-5"}, {orgs, "acme"}} {
		require.Eventually(t, func() bool {
			n, err := k.r.InFlight(ctx, k.key)
			return err == nil && n == 0
		}, 5*time.Second, time.Millisecond, "every lease of %s removed", k.key)
	}
	t.Logf("admissions without Redis: %d; failed calls to Redis: %d", degraded.Load(), providers.Stats().StoreErrors+orgs.Stats().StoreErrors)

	// The node of {providers} loses its data: the pause is that name's,
	// its key on that node with the name's other keys; {tenants}, on
	// another node, goes on.
	node := redis.NewClient(&redis.Options{Addr: nodeOf("providers")})
	defer node.Close()
	require.NoError(t, node.FlushAll(ctx).Err())
	_, err = providers.TryAcquire("zai")
	assert.ErrorIs(t, err, ErrPaused)
	o, err := orgs.TryAcquire("acme")
	require.NoError(t, err)
	o.Release()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := providers.AcquireAll(wctx, "zai", "zai/glm-5")
	require.NoError(t, err, "admissions resume after the pause")
	p.Release()
}
