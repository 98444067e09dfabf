package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Admit sends its calls in one pipeline, each a transaction of its own,
// run in order: a call that fails (a lease id PostgreSQL cannot store)
// fails alone, the calls before it stay made, and each call after it
// gets its own reply. On the server, and behind PgBouncer.
func TestAdmitPipeline(t *testing.T) {
	srv := pgtest.Start(t)
	stores := map[string]driver.Store{
		"direct":    store(t, srv, "direct"),
		"pgbouncer": server{Server: srv, via: srv.Bouncer()}.Store(t, "bounced"),
	}
	for name, st := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			call := func(key, id string) *driver.AdmitCall {
				return &driver.AdmitCall{Lease: id, Keys: []string{key}, Limits: []int{2}, TTL: time.Minute, Weight: 1,
					Claim: time.Second, Live: 5 * time.Second, MaxQueue: -1, MaxFlowQueue: -1, Proc: "test"}
			}
			rs, err := st.Admit(ctx, []*driver.AdmitCall{call("a", "1"), call("a", "2"), call("a", "bad\x00id"), call("a", "3"), call("b", "4")})
			require.NoError(t, err)
			require.Len(t, rs, 5)
			// A refusal's reply counts the key's leases.
			for i, want := range []struct {
				status driver.Status
				count  int64
			}{{driver.StatusAdmitted, 0}, {driver.StatusAdmitted, 0}, {}, {driver.StatusFull, 2}, {driver.StatusAdmitted, 0}} {
				if i == 2 {
					var pgErr *pgconn.PgError
					assert.True(t, errors.As(rs[i].Err, &pgErr), "call 2 fails alone: %v", rs[i].Err)
					continue
				}
				require.NoError(t, rs[i].Err, "call %d", i)
				assert.Equal(t, want.status, rs[i].Status, "call %d", i)
				assert.Equal(t, want.count, rs[i].Count, "call %d", i)
			}
			for key, want := range map[string]int{"a": 2, "b": 1} {
				n, err := st.Count(ctx, key)
				require.NoError(t, err)
				assert.Equal(t, want, n, "key %s", key)
			}
		})
	}
}

// What Admit relies on PgBouncer for in transaction mode: the replies of
// a client's pipeline (a Sync after each query) all reach that client, in
// order, while more clients pipeline than PgBouncer has server
// connections to lend.
func TestPipelinesBehindPgBouncer(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.Bouncer()
	var wg sync.WaitGroup
	var mu sync.Mutex
	right, wrong := 0, 0
	for c := range 80 { // PgBouncer lends 40 server connections
		wg.Go(func() {
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(ctx)
			for round := range 10 {
				p := conn.PgConn().StartPipeline(ctx)
				n := 1 + (c+round)%20
				for i := range n {
					v := fmt.Sprintf("%d/%d/%d", c, round, i)
					p.SendQueryParams("SELECT $1::text, pg_sleep(random() * 0.002)", [][]byte{[]byte(v)}, nil, nil, nil)
					p.SendPipelineSync()
				}
				if err := p.Flush(); err != nil {
					t.Error(err)
					return
				}
				for i := range n {
					want := fmt.Sprintf("%d/%d/%d", c, round, i)
					got := ""
					if res, err := p.GetResults(); err == nil {
						if rr, ok := res.(*pgconn.ResultReader); ok {
							if r := rr.Read(); r.Err == nil && len(r.Rows) == 1 {
								got = string(r.Rows[0][0])
							}
						}
					}
					mu.Lock()
					if got == want {
						right++
					} else {
						wrong++
					}
					mu.Unlock()
					if res, err := p.GetResults(); err != nil {
						t.Error(err)
						return
					} else if _, ok := res.(*pgconn.PipelineSync); !ok {
						t.Errorf("a pipeline's Sync answered by %T", res)
						return
					}
				}
				if err := p.Close(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d replies to their query, %d not", right, wrong)
	assert.Zero(t, wrong)
	assert.Positive(t, right)
}
