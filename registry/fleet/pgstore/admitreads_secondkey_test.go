package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A newcomer of {k,o}, k full, o's flow full: the reply names o (status
// 5, key 2) with o's units and earliest expiry, as before revision 26.
// The random states of TestAdmitReadsAgainstBefore never name a second
// key for a full flow.
func TestAdmitReadsFlowFullOnSecondKey(t *testing.T) {
	srv := pgtest.Start(t)
	p := pool(t, srv, 1)
	ctx := context.Background()
	_, err := pgstore.New(ctx, p, "setup")
	require.NoError(t, err)
	st := admitState{stmts: []string{
		`INSERT INTO inflight_key (fleet, key) VALUES ('sd', 'k'), ('sd', 'o')`,
		fmt.Sprintf(`INSERT INTO inflight_proc (fleet, proc, alive_until) VALUES ('sd', 'live', %d)`, sdNow+10_000_000),
		fmt.Sprintf(`INSERT INTO inflight_fleet (fleet, epoch, pause_until, last_pause, last_ttl, heard) VALUES ('sd', %d, 0, 5000, 30000, %d)`, sdEpoch, sdNow),
		fmt.Sprintf(`INSERT INTO inflight_marker (fleet, epoch) VALUES ('sd', %d)`, sdEpoch),
		fmt.Sprintf(`INSERT INTO inflight_lease (fleet, key, lease, expires, units) VALUES ('sd', 'k', 'a1', %d, 3), ('sd', 'o', 'b1', %d, 1)`, sdNow+5000, sdNow+7000),
		fmt.Sprintf(`INSERT INTO inflight_ticket (fleet, key, ticket, rank, tag, seq, proc, flow, arrival, finish, keys, limits, expires, units)
			VALUES ('sd', 'o', 'to', 0, 1, 1, 'live', 'f1', 999, 1, '{o}', '{3}', %d, 3)`, sdNow+100_000),
		`INSERT INTO inflight_flow (fleet, key, rank, flow, finish, base, n) VALUES ('sd', 'o', 0, 'f1', 1, NULL, 1)`,
	}}
	for _, c := range []struct {
		maxQ, maxF int
		want       string
	}{{-1, 1, "[5 2 1 1007000"}, {1, -1, "[4 2 1 1007000"}} {
		st.calls = []string{fmt.Sprintf(`SELECT inflight_admit('sd', 'n1', '{k,o}', '{3,3}', 30000, 0, %d, 0, true, false, 1000, 0::smallint, 'f1', 1, 'live', %d, %d, 5000, false, NULL, NULL, 1, NULL)`,
			sdEpoch, c.maxQ, c.maxF)}
		now := run26(t, p, st, false)
		before := run26(t, p, st, true)
		require.Equal(t, before, now)
		require.True(t, strings.Contains(now, c.want), now)
	}
}
