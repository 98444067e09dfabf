package pgstore_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// The conformance suite on a real PostgreSQL server, with its faults:
// Kill and Restart keep the data (crash recovery from the write-ahead
// log), Lose empties the fleet's tables as a failover to an empty standby
// would.
func TestConformance(t *testing.T) {
	fleettest.Run(t, func(t *testing.T) fleettest.Server {
		srv := pgtest.Start(t)
		return server{Server: srv, admin: pool(t, srv, 1)}
	})
}

// The conformance suite through PgBouncer in transaction mode, set up as
// the package comment says: the pool's statements unprepared
// (default_query_exec_mode=exec: pgx's statement cache is session state),
// Listen on a connection of its own straight to the database. The faults
// are the server's, behind PgBouncer (which connects to it again); the
// network cut is between a process and PgBouncer.
func TestConformanceBehindPgBouncer(t *testing.T) {
	fleettest.Run(t, func(t *testing.T) fleettest.Server {
		srv := pgtest.Start(t)
		return server{Server: srv, admin: pool(t, srv, 1), via: srv.Bouncer()}
	})
}

type server struct {
	*pgtest.Server
	admin *pgxpool.Pool // the test's own connection, for Queued and Lose
	via   string        // the URL of PgBouncer in front of it; "": none
}

func (s server) Store(t testing.TB, fleet string) driver.Store {
	if s.via == "" {
		return store(t, s.Server, fleet)
	}
	return s.StoreVia(t, fleet, s.Address())
}

// front is the URL the stores connect to: PgBouncer's, or the server's.
func (s server) front() string {
	if s.via != "" {
		return s.via
	}
	return s.URL
}

func (s server) Address() string {
	u, err := url.Parse(s.front())
	if err != nil {
		panic(err)
	}
	return u.Host
}

func (s server) StoreVia(t testing.TB, fleet, addr string) driver.Store {
	u, err := url.Parse(s.front())
	require.NoError(t, err)
	u.Host = addr
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.ConnConfig.ConnectTimeout = time.Second
	var opts []pgstore.Option
	if s.via != "" {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		direct, err := pgx.ParseConfig(s.URL)
		require.NoError(t, err)
		opts = append(opts, pgstore.WithListenConfig(direct))
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	st, err := pgstore.New(context.Background(), p, fleet, opts...)
	require.NoError(t, err)
	return st
}

func (s server) Queued(fleet, key string) (int, error) {
	var n int
	err := s.admin.QueryRow(context.Background(), "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = $2", fleet, pgstore.StoredKey(key)).Scan(&n)
	return n, err
}

func (s server) Lose() {
	_, err := s.admin.Exec(context.Background(), `TRUNCATE inflight_fleet, inflight_marker, inflight_key, inflight_lease,
		inflight_ticket, inflight_flow, inflight_proc, inflight_tomb, inflight_learned`)
	if err != nil {
		panic(err)
	}
}
