package pgstore_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

// listen runs s.Listen for proc until the test's end, and returns what it
// delivers.
func listen(t *testing.T, s *pgstore.Store, proc string) *counter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var c counter
	var wg sync.WaitGroup
	wg.Go(func() { s.Listen(ctx, proc, &c) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return &c
}

// Listen's connection is made as the pool makes its own, through its
// hooks: with the credentials a BeforeConnect gives (a token made for each
// connection), and the search_path an AfterConnect sets. Without them it
// would fail to listen, and waiters would learn of their grants only when
// they ask again.
func TestListenThroughThePoolsHooks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup string
		hook  func(*pgxpool.Config)
	}{
		{"with the credentials from BeforeConnect", "", func(cfg *pgxpool.Config) {
			cfg.ConnConfig.User = "nobody" // refused: BeforeConnect sets the one that logs in
			cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
				cc.User = "inflight"
				return nil
			}
		}},
		{"in the schema that AfterConnect picks", "CREATE SCHEMA tenant", func(cfg *pgxpool.Config) {
			cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				_, err := conn.Exec(ctx, "SET search_path = tenant")
				return err
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := pgtest.Start(t) // public empty: a listen connection in it finds no schema
			ctx := context.Background()
			if tc.setup != "" {
				_, err := pool(t, srv, 1).Exec(ctx, tc.setup)
				require.NoError(t, err)
			}
			cfg, err := pgxpool.ParseConfig(srv.URL)
			require.NoError(t, err)
			tc.hook(cfg)
			p, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(p.Close)
			s, err := pgstore.New(ctx, p, "hooks", pgstore.WithListenRetry(50*time.Millisecond))
			require.NoError(t, err)

			c := listen(t, s, "p")
			require.Eventually(t, func() bool { return c.listening.Load() == 1 }, 10*time.Second, time.Millisecond, "listens")
			_, err = p.Exec(ctx, "SELECT pg_notify(inflight_channel($1, $2), 'ticket')", "hooks", "p")
			require.NoError(t, err)
			require.Eventually(t, func() bool { return c.granted.Load() == 1 }, 10*time.Second, time.Millisecond, "a grant")
		})
	}
}

// logs is a log's text, written from any goroutine.
type logs struct {
	mu sync.Mutex // protects b
	b  strings.Builder
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A Listen that cannot listen says so in the log, once while it keeps
// failing, and again when it listens after.
func TestListenFailureIsLogged(t *testing.T) {
	srv := pgtest.Start(t)
	refused, err := pgx.ParseConfig(strings.Replace(srv.URL, "inflight@", "nobody@", 1))
	require.NoError(t, err)
	var l logs
	s := store(t, srv, "logged", pgstore.WithListenConfig(refused), pgstore.WithListenRetry(10*time.Millisecond),
		pgstore.WithLogger(slog.New(slog.NewTextHandler(&l, nil))))
	c := listen(t, s, "p")
	require.Eventually(t, func() bool { return strings.Contains(l.String(), "Listen failed") }, 10*time.Second, time.Millisecond)
	_, err = pool(t, srv, 1).Exec(context.Background(), "CREATE ROLE nobody LOGIN")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.listening.Load() == 1 }, 10*time.Second, time.Millisecond, "listens")
	assert.Equal(t, 1, strings.Count(l.String(), "Listen failed"), l.String())
	assert.Contains(t, l.String(), "listening again")
}

// probes counts, on a connection of the test's own straight to srv's
// database, Listen's probes sent to proc's channel in fleet until the
// test's end.
func probes(t *testing.T, srv *pgtest.Server, fleet, proc string) *atomic.Int64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, srv.URL)
	require.NoError(t, err)
	var channel string
	require.NoError(t, conn.QueryRow(ctx, "SELECT inflight_channel($1, $2)", fleet, proc).Scan(&channel))
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		defer conn.Close(context.Background())
		for {
			note, err := conn.WaitForNotification(ctx)
			if err != nil {
				return // the test's end
			}
			if note.Payload == pgstore.ProbePayload {
				n.Add(1)
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return &n
}

// Listen through PgBouncer in transaction mode, as the pool connects
// (no WithListenConfig), listens but receives nothing: LISTEN holds only
// for its transaction, on the server connection that ran it. Its probes,
// sent through the pool, do not arrive, and it says so, once while they
// keep not arriving, naming the likely cause; a probe is never taken for
// a grant.
func TestListenWarnsWhenNothingArrives(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(srv.Bouncer())
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as the package comment says
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	var l logs
	s, err := pgstore.New(ctx, p, "pooled", pgstore.WithListenCheck(100*time.Millisecond),
		pgstore.WithLogger(slog.New(slog.NewTextHandler(&l, nil))))
	require.NoError(t, err)
	sent := probes(t, srv, "pooled", "p")
	c := listen(t, s, "p")

	require.Eventually(t, func() bool { return strings.Contains(l.String(), "receives nothing") }, time.Minute, time.Millisecond,
		"a warning")
	assert.Contains(t, l.String(), "level=WARN")
	assert.Contains(t, l.String(), "transaction mode")
	assert.Contains(t, l.String(), "WithListenConfig")
	// Three more probes sent: each of the first two was awaited until it
	// went unanswered (the next is sent only then), with no warning again.
	after := sent.Load()
	require.Eventually(t, func() bool { return sent.Load() >= after+3 }, time.Minute, time.Millisecond, "probes sent again")
	assert.Equal(t, 1, strings.Count(l.String(), "receives nothing"), "warned once while nothing arrives: %s", l.String())
	assert.Positive(t, c.listening.Load())
	assert.Zero(t, c.granted.Load(), "probes delivered as grants")
}

// Listen straight to the database receives its probes, drops them (they
// are no grants), and logs nothing of them.
func TestListenReceivesItsProbes(t *testing.T) {
	srv := pgtest.Start(t)
	var l logs
	s := store(t, srv, "direct", pgstore.WithListenCheck(100*time.Millisecond),
		pgstore.WithLogger(slog.New(slog.NewTextHandler(&l, nil))))
	sent := probes(t, srv, "direct", "p")
	c := listen(t, s, "p")
	// A probe is sent after the one before arrived, and the connection was
	// quiet for a check since.
	require.Eventually(t, func() bool { return sent.Load() >= 5 }, time.Minute, time.Millisecond, "probes")
	assert.NotContains(t, l.String(), "receives nothing")
	assert.Zero(t, c.granted.Load(), "probes delivered as grants")
	_, err := pool(t, srv, 1).Exec(context.Background(), "SELECT pg_notify(inflight_channel($1, $2), 'ticket')", "direct", "p")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return c.granted.Load() == 1 }, time.Minute, time.Millisecond, "a grant delivered beside them")
}
