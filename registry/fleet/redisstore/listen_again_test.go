package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
)

// listens counts Listen's subscriptions.
type listens chan struct{}

func (l listens) Listening()   { l <- struct{}{} }
func (listens) Granted(string) {}
func (listens) Learned(string) {}

// A subscription whose connection is killed (CLIENT KILL, a proxy that
// drops it) is made again at once, not after the retry interval, which is
// for a Redis that cannot be reached: the waiters' grants come by message
// again (they came only when the waiters asked again meanwhile).
func TestListenAgainAtOnceAfterAKill(t *testing.T) {
	srv := redistest.Start(t)
	s := redisstore.New(srv.Client(), "again", redisstore.WithListenRetry(time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	l := make(listens, 4)
	done := make(chan struct{})
	go func() { s.Listen(ctx, "p", l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-l:
	case <-time.After(10 * time.Second):
		t.Fatal("Listen did not subscribe")
	}
	for range 3 {
		require.NoError(t, srv.Client().ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err())
		select {
		case <-l:
		case <-time.After(10 * time.Second):
			t.Fatal("Listen did not subscribe again within 10 s (its retry interval is a minute)")
		}
	}
}

// A connection that breaks as soon as it subscribes is not dialled again
// without pause: Listen subscribes again at once at most every 100 ms,
// else after its retry interval. (It subscribed some 4,000 times a second,
// and each subscription woke every waiter.)
func TestListenAgainNotInALoop(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	s := redisstore.New(srv.Client(), "loop", redisstore.WithListenRetry(time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	l := make(listens, 1000)
	done := make(chan struct{})
	go func() { s.Listen(ctx, "p", l); close(done) }()
	<-l
	// Each subscription's connection killed as soon as it is seen.
	require.NoError(t, admin.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err())
	stop := time.After(2 * time.Second)
	n := 0
	for loop := true; loop; {
		select {
		case <-l:
			n++
			require.NoError(t, admin.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err())
		case <-stop:
			loop = false
		}
	}
	cancel()
	<-done
	t.Logf("%d subscriptions in 2 s", n)
	assert.LessOrEqual(t, n, 25, "at most one each 100 ms")
	assert.GreaterOrEqual(t, n, 2, "not one each retry interval (1 s)")
}
