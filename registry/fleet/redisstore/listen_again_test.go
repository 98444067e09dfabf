package redisstore_test

import (
	"context"
	"testing"
	"time"

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
