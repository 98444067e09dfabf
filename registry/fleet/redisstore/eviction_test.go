package redisstore_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// listenOnce runs a store's Listen on rdb until it has subscribed and its
// eviction check, which runs beside the subscription, has had the INFO of
// each of the masters it reaches answered, and returns what it logged
// (Listen returns once the check is over).
func listenOnce(t *testing.T, rdb redis.UniversalClient, masters int) string {
	t.Helper()
	let := make(chan struct{})
	close(let)
	h := hookInfo(rdb, let)
	var logs testrig.Buffer
	s := redisstore.New(rdb, "evict", redisstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var c counter
	done := make(chan struct{})
	go func() { s.Listen(ctx, "p", &c); close(done) }()
	require.Eventually(t, func() bool { return c.listening.Load() >= 1 }, 10*time.Second, time.Millisecond, "Listen subscribes")
	timeout := time.After(10 * time.Second)
	for range masters {
		select {
		case <-h.answered:
		case <-timeout:
			t.Fatal("Listen did not check eviction")
		}
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
		logs := listenOnce(t, srv.Client(), 1)
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
		logs := listenOnce(t, cl.Client(), 3)
		assert.Contains(t, logs, "may evict")
	}
}

// infoHook holds every INFO until let is closed (or its context ends) and
// tells each that is answered on answered.
type infoHook struct {
	let      chan struct{}
	answered chan struct{}
}

func (infoHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h infoHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "info" {
			return next(ctx, cmd)
		}
		select {
		case <-h.let:
		case <-ctx.Done():
		}
		err := next(ctx, cmd)
		h.answered <- struct{}{}
		return err
	}
}
func (infoHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// hookInfo installs on rdb (a client, or each node of a Cluster's) an
// infoHook that lets INFO through once let is closed.
func hookInfo(rdb redis.UniversalClient, let chan struct{}) infoHook {
	h := infoHook{let: let, answered: make(chan struct{}, 64)}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(h) })
	case *redis.Client:
		c.AddHook(h)
	}
	return h
}

// Listen listens, and delivers the grants published, while its check of
// eviction waits for the server (a Cluster's master slow to answer, a
// client with long timeouts): a waiter's grant heard only once the check
// ends may be past its claim window, and the fleet wakes its waiters (a
// grant may have been missed) only once Listen tells Listening.
func TestListenDoesNotWaitForTheEvictionCheck(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	let := make(chan struct{})
	hookInfo(rdb, let)
	s := redisstore.New(rdb, "slowcheck")
	c := listenCounting(t, s) // it tells Listening while INFO is held
	require.NoError(t, srv.Client().Publish(context.Background(), redisstore.WakeChannel(s, "p"), "ticket").Err())
	require.Eventually(t, func() bool { return c.granted.Load() == 1 }, 10*time.Second, time.Millisecond,
		"the grant delivered while the eviction check waited")
	assert.Equal(t, "ticket", c.ticket.Load())
}
