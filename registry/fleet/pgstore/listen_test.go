package pgstore_test

import (
	"context"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/internal/netcut"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// counter counts what a Listen delivers.
type counter struct{ listening, granted, learned atomic.Int64 }

func (c *counter) Listening()     { c.listening.Add(1) }
func (c *counter) Granted(string) { c.granted.Add(1) }
func (c *counter) Learned(string) { c.learned.Add(1) }

// Listen's connection lost without a word (a black hole: it stays open
// and nothing comes back) is noticed by its health check, and Listen
// connects anew: without the check it would deliver nothing for ever. A
// quiet connection that answers is kept (its waits time out and it is
// checked, over several checks, and a grant still comes through).
func TestListenNoticesASilentConnection(t *testing.T) {
	srv := pgtest.Start(t)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	px := netcut.Start(t, u.Host)
	u.Host = px.Addr
	cfg, err := pgx.ParseConfig(u.String())
	require.NoError(t, err)
	p := pool(t, srv, 2)
	const check = 200 * time.Millisecond
	s, err := pgstore.New(context.Background(), p, "quiet",
		pgstore.WithListenConfig(cfg), pgstore.WithListenCheck(check), pgstore.WithListenRetry(50*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var c counter
	var wg sync.WaitGroup
	wg.Go(func() { s.Listen(ctx, "p", &c) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	grant := func(what string) {
		t.Helper()
		before := c.granted.Load()
		_, err := p.Exec(context.Background(), "SELECT pg_notify(inflight_channel($1, $2), 'ticket')", "quiet", "p")
		require.NoError(t, err)
		require.Eventually(t, func() bool { return c.granted.Load() > before }, 10*time.Second, time.Millisecond, what)
	}
	require.Eventually(t, func() bool { return c.listening.Load() == 1 }, 10*time.Second, time.Millisecond, "listens")
	quiet := time.NewTimer(4 * check) // quiet long enough for a few checks
	<-quiet.C
	assert.Equal(t, int64(1), c.listening.Load(), "a quiet connection that answers is kept")
	grant("a grant on the checked connection")
	px.Blackhole()
	require.Eventually(t, func() bool { return c.listening.Load() >= 2 }, 10*time.Second, 5*time.Millisecond,
		"listens anew on a connection of its own")
	grant("a grant on the new connection")
}
