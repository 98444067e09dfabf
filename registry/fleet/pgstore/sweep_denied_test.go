package pgstore_test

import (
	"context"
	"strings"
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

// A role that may not delete keys' rows is told so by the server's log
// once a sweep interval per fleet, not at every renewal of every process:
// a sweep refused is a sweep made, and the next is due a second later.
// Found by review: each renewal after the first swept again, scanning up
// to 256 keys, and logged a warning, so a fleet of many processes filled
// the server's log.
func TestSweepRefusedWaitsForTheNextInterval(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	owner := pool(t, srv, 1)
	require.NoError(t, pgstore.Migrate(ctx, owner))
	_, err := owner.Exec(ctx, `CREATE ROLE nodelete LOGIN;
		GRANT USAGE ON SCHEMA public TO nodelete;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO nodelete;
		REVOKE DELETE ON inflight_key FROM nodelete;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO nodelete;
		GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO nodelete`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(strings.Replace(srv.URL, "inflight@", "nodelete@", 1))
	require.NoError(t, err)
	var warned atomic.Int32
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "not swept") {
			warned.Add(1)
		}
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	// The sweeper's row, and a sweep due at once.
	_, err = p.Exec(ctx, "SELECT inflight_sweep_keys('f')")
	require.NoError(t, err)
	_, err = owner.Exec(ctx, "UPDATE inflight_sweeper SET swept = 0")
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, renewals(t, p, 20))
	// One sweep is due at first, and one more each second since.
	due := int32(time.Since(start)/time.Second) + 1
	assert.LessOrEqual(t, warned.Load(), due, "warnings for 20 renewals, each with a sweep, in %v", time.Since(start))
}
