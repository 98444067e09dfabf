package redisstore_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// listening tells when Listen has subscribed.
type listening struct {
	once sync.Once
	c    chan struct{}
}

func (l *listening) Listening()   { l.once.Do(func() { close(l.c) }) }
func (*listening) Granted(string) {}
func (*listening) Learned(string) {}

// listenOnce runs a store's Listen on rdb until it has subscribed, and
// returns what it logged.
func listenOnce(t *testing.T, rdb redis.UniversalClient) string {
	t.Helper()
	var logs testrig.Buffer
	s := redisstore.New(rdb, "evict", redisstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx, cancel := context.WithCancel(context.Background())
	l := &listening{c: make(chan struct{})}
	done := make(chan struct{})
	go func() { s.Listen(ctx, "p", l); close(done) }()
	select {
	case <-l.c:
	case <-time.After(10 * time.Second):
		t.Fatal("Listen did not subscribe")
	}
	cancel()
	<-done
	return logs.String()
}

// Listen warns when the server may evict the fleet's keys (a memory limit
// and a policy other than noeviction), and not otherwise: an evicted key's
// leases would count as expired, and be taken over their live holders.
func TestListenWarnsOfEviction(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	for _, tc := range []struct {
		limit, policy string
		warns         bool
	}{{"0", "volatile-lru", false}, {"1gb", "noeviction", false}, {"1gb", "volatile-lru", true}, {"1gb", "allkeys-lru", true}} {
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory", tc.limit).Err())
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err())
		logs := listenOnce(t, srv.Client())
		assert.Equal(t, tc.warns, strings.Contains(logs, "may evict"), "maxmemory %s, %s: %q", tc.limit, tc.policy, logs)
	}
}

// On a Cluster every master is asked: one that may evict is warned of
// whichever node the client would have asked.
func TestListenWarnsOfEvictionOnACluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	one := cl.Nodes[1].Client()
	require.NoError(t, one.ConfigSet(ctx, "maxmemory", "1gb").Err())
	require.NoError(t, one.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
	for range 4 {
		logs := listenOnce(t, cl.Client())
		assert.Contains(t, logs, "may evict")
	}
}
