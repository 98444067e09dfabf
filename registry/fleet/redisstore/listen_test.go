package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
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

// counter counts what a Listen delivers, and keeps the last ticket
// granted.
type counter struct {
	listening, granted atomic.Int64
	ticket             atomic.Value
}

func (c *counter) Listening() { c.listening.Add(1) }
func (c *counter) Granted(ticket string) {
	c.ticket.Store(ticket)
	c.granted.Add(1)
}
func (c *counter) Learned(string) {}

// Listen's connection lost without a word (a black hole: it stays open
// and nothing comes back) is noticed by its check, and Listen subscribes
// anew: without the check it would deliver nothing until the kernel gave
// the connection up, minutes on. A quiet connection that answers is kept
// (its reads time out and it is asked for a PONG, over several checks,
// and a grant still comes through).
func TestListenNoticesASilentConnection(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv)
	const check = 200 * time.Millisecond
	s := redisstore.New(px.Client(), "quiet", redisstore.WithListenCheck(check), redisstore.WithListenRetry(50*time.Millisecond))
	c := listenCounting(t, s)
	direct := srv.Client()
	grant := func(what string) {
		t.Helper()
		before := c.granted.Load()
		require.NoError(t, direct.Publish(context.Background(), redisstore.WakeChannel(s, "p"), "ticket").Err())
		require.Eventually(t, func() bool { return c.granted.Load() > before }, 10*time.Second, time.Millisecond, what)
	}
	// Quiet long enough for a few checks, each a PING answered (a check,
	// then at least a second for the answer).
	assert.Never(t, func() bool { return c.listening.Load() != 1 }, 10*check, 10*time.Millisecond,
		"a quiet connection that answers is kept")
	grant("a grant on the checked connection")
	px.Blackhole()
	require.Eventually(t, func() bool { return c.listening.Load() >= 2 }, 10*time.Second, 5*time.Millisecond,
		"listens anew on a connection of its own")
	grant("a grant on the new connection")
}

// WithListenCheck refuses a check that is not a duration.
func TestWithListenCheckPanics(t *testing.T) {
	assert.Panics(t, func() { redisstore.WithListenCheck(0) })
	assert.Panics(t, func() { redisstore.WithListenCheck(-time.Second) })
}

// watchedConn tells what the client writes and reads through it.
type watchedConn struct {
	net.Conn
	wrote, read func([]byte)
}

func (c *watchedConn) Write(b []byte) (int, error) {
	if c.wrote != nil {
		c.wrote(b)
	}
	return c.Conn.Write(b)
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.read != nil {
		c.read(b[:n])
	}
	return n, err
}

// watchedClient is a client of addr with the recommended timeouts, its
// connections watched by wrote and read (either may be nil).
func watchedClient(t *testing.T, addr string, wrote, read func([]byte)) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 250 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond, ContextTimeoutEnabled: true, MaxRetries: 1, Protocol: 2,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := new(net.Dialer).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &watchedConn{Conn: c, wrote: wrote, read: read}, nil
		}})
	t.Cleanup(func() { c.Close() })
	return c
}

// listenCounting runs s.Listen for proc "p" until the test's cleanup.
func listenCounting(t *testing.T, s *redisstore.Store) *counter {
	ctx, cancel := context.WithCancel(context.Background())
	var c counter
	var wg sync.WaitGroup
	wg.Go(func() { s.Listen(ctx, "p", &c) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	require.Eventually(t, func() bool { return c.listening.Load() == 1 }, 10*time.Second, time.Millisecond, "listens")
	return &c
}

// The connection the client dials again after a break, lost without a
// word once its handshake is done (its SUBSCRIBE and all after it
// dropped), is checked as the first one is: Listen read it, its reads
// timing out, for ever.
func TestListenChecksAConnectionDialledAgain(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv)
	var trap atomic.Bool // black-hole the next SUBSCRIBE's connection as it is written
	rdb := watchedClient(t, px.Addr, func(b []byte) {
		if bytes.Contains(b, []byte("subscribe\r\n")) && trap.CompareAndSwap(true, false) {
			px.Blackhole()
		}
	}, nil)
	const check = 200 * time.Millisecond
	s := redisstore.New(rdb, "again", redisstore.WithListenCheck(check), redisstore.WithListenRetry(50*time.Millisecond))
	c := listenCounting(t, s)
	trap.Store(true)
	require.NoError(t, srv.Client().ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err())
	require.Eventually(t, func() bool { return !trap.Load() }, 10*time.Second, time.Millisecond, "dials again")
	require.Eventually(t, func() bool { return c.listening.Load() >= 2 }, 40*check, time.Millisecond,
		"gives the connection dialled again up, and listens anew")
	require.NoError(t, srv.Client().Publish(context.Background(), redisstore.WakeChannel(s, "p"), "ticket").Err())
	require.Eventually(t, func() bool { return c.granted.Load() >= 1 }, 10*time.Second, time.Millisecond, "a grant")
}

// A SUBSCRIBE refused (BUSY: the connection dialled again while a script
// runs past busy-reply-threshold; HELLO is answered, SUBSCRIBE is not)
// leaves a connection that answers PINGs and is subscribed to nothing:
// Listen subscribes again, and hears the grants once the script is over.
func TestListenSubscribesAgainWhenRefused(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv)
	var busy atomic.Int64
	rdb := watchedClient(t, px.Addr, nil, func(b []byte) {
		if bytes.Contains(b, []byte("-BUSY")) {
			busy.Add(1)
		}
	})
	const check = 200 * time.Millisecond
	s := redisstore.New(rdb, "refused", redisstore.WithListenCheck(check), redisstore.WithListenRetry(50*time.Millisecond),
		redisstore.WithLogger(slog.New(slog.DiscardHandler)))
	c := listenCounting(t, s)
	ctx := context.Background()
	admin := srv.Client()
	require.NoError(t, admin.ConfigSet(ctx, "busy-reply-threshold", "100").Err())
	scripter := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: -1, MaxRetries: -1})
	t.Cleanup(func() { scripter.Close() })
	ran := make(chan struct{})
	go func() { defer close(ran); scripter.Eval(ctx, "while true do end", nil) }()
	t.Cleanup(func() {
		admin.ScriptKill(ctx)
		<-ran
	})
	require.Eventually(t, func() bool {
		err := admin.Ping(ctx).Err()
		return err != nil && strings.HasPrefix(err.Error(), "BUSY")
	}, 10*time.Second, 10*time.Millisecond, "the server answers BUSY")
	px.Cut() // Listen's connection breaks; the client dials again
	px.Heal()
	require.Eventually(t, func() bool { return busy.Load() > 0 }, 10*time.Second, time.Millisecond, "SUBSCRIBE refused")
	require.NoError(t, admin.ScriptKill(ctx).Err())
	<-ran
	require.Eventually(t, func() bool {
		return admin.Publish(ctx, redisstore.WakeChannel(s, "p"), "ticket").Err() == nil && c.granted.Load() >= 1
	}, 10*time.Second, 10*time.Millisecond, "a grant once the script is over")
	assert.GreaterOrEqual(t, c.listening.Load(), int64(2), "listens again")
}
