package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A pool whose connections have a notification handler of their own (an
// application that listens on its connections) gives Listen a connection
// made as the pool makes its own, handler and all; Listen still delivers
// what is sent to it, and does not fail. Found by review: pgx hands every
// notification to that handler and none to WaitForNotification, which
// returned no notification and no error, and Listen panicked on it (at
// its own probe, moments after it listened), taking the process down.
func TestListenOnAPoolWithANotificationHandler(t *testing.T) {
	srv := pgtest.Start(t)
	cfg, err := pgxpool.ParseConfig(srv.URL)
	require.NoError(t, err)
	cfg.MaxConns = 2
	var theirs atomic.Int64
	cfg.ConnConfig.OnNotification = func(*pgconn.PgConn, *pgconn.Notification) { theirs.Add(1) }
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	s, err := pgstore.New(context.Background(), p, "handled")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var c counter
	var wg sync.WaitGroup
	panicked := make(chan any, 1)
	wg.Go(func() {
		defer func() {
			if r := recover(); r != nil {
				panicked <- r
			}
		}()
		s.Listen(ctx, "p", &c)
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	require.Eventually(t, func() bool { return c.listening.Load() == 1 }, 10*time.Second, time.Millisecond, "listens")
	_, err = p.Exec(context.Background(), "SELECT pg_notify(inflight_channel($1, $2), 'ticket')", "handled", "p")
	require.NoError(t, err)
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for c.granted.Load() == 0 {
		select {
		case r := <-panicked:
			t.Fatalf("Listen panicked: %v", r)
		case <-deadline.C:
			t.Fatal("the grant was not delivered")
		case <-tick.C:
		}
	}
	assert.Zero(t, theirs.Load(), "the pool's handler is not given the fleet's notifications")
	select {
	case r := <-panicked:
		t.Fatal(fmt.Sprint("Listen panicked: ", r))
	default:
	}
}
