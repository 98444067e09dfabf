package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// Admit and Abandon make their calls in order, each a transaction of its
// own: a call that fails (a lease id PostgreSQL cannot store) fails
// alone, the calls before it stay made, and each call after it gets its
// own reply. On the server, and through PgBouncer in transaction mode.
func TestCallsFailAlone(t *testing.T) {
	srv := pgtest.Start(t)
	t.Run("direct", func(t *testing.T) { callsFailAlone(t, store(t, srv, "direct")) })
	via := srv.Bouncer() // on the test's goroutine: it may skip the test
	t.Run("pgbouncer", func(t *testing.T) { callsFailAlone(t, server{Server: srv, via: via}.Store(t, "bounced")) })
}

func callsFailAlone(t *testing.T, st driver.Store) {
	ctx := context.Background()
	call := func(key, id string) *driver.AdmitCall {
		c := kcall(id, 2, false)
		c.Keys = []string{key}
		return c
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
	countIs(t, st, "a", 2, "after the admissions")
	countIs(t, st, "b", 1, "after the admissions")

	abandon := func(key, id string) *driver.AbandonCall {
		return &driver.AbandonCall{Lease: id, Keys: []string{key}, TTL: time.Minute, Claim: time.Second}
	}
	errs, err := st.Abandon(ctx, []*driver.AbandonCall{abandon("a", "1"), abandon("a", "bad\x00id"), abandon("b", "4")})
	require.NoError(t, err)
	require.Len(t, errs, 3)
	assert.NoError(t, errs[0])
	var pgErr *pgconn.PgError
	assert.True(t, errors.As(errs[1], &pgErr), "abandon 1 fails alone: %v", errs[1])
	assert.NoError(t, errs[2])
	countIs(t, st, "a", 1, "after the abandons")
	countIs(t, st, "b", 0, "after the abandons")
}

// A pool whose statements are prepared (pgx's default), through PgBouncer
// in transaction mode: a statement prepared on one of PgBouncer's server
// connections is missing on another, or there already. The errors that
// come of it say what to change.
func TestPreparedThroughPooler(t *testing.T) {
	srv := pgtest.Start(t)
	cfg, err := pgxpool.ParseConfig(srv.Bouncer())
	require.NoError(t, err)
	cfg.MaxConns = 8
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	var mu sync.Mutex
	hinted, bare := 0, 0
	check := func(err error) {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P05" && pgErr.Code != "26000" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(err.Error(), "default_query_exec_mode=exec") {
			hinted++
		} else {
			bare++
			t.Logf("no hint: %v", err)
		}
	}
	ctx := context.Background()
	for round := 0; round < 20 && hinted == 0; round++ {
		st, err := pgstore.New(ctx, p, "prepared")
		check(err)
		if err != nil {
			continue
		}
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 10 {
					id := fmt.Sprint(round, "/", g, "/", i)
					r, err := st.AdmitOne(ctx, kcall(id, 1000, false))
					check(err)
					if err == nil && r.Status == driver.StatusAdmitted {
						check(st.Release(ctx, &driver.ReleaseCall{Claim: time.Second, Pairs: []driver.Release{{Key: "k", Lease: id, Limit: 1000}}}))
					}
					_, err = st.Count(ctx, "k")
					check(err)
				}
			})
		}
		wg.Wait()
	}
	t.Logf("%d errors of a prepared statement with the hint, %d without", hinted, bare)
	assert.Positive(t, hinted, "no prepared statement met the pooler's other connections")
	assert.Zero(t, bare)
}

// A queue's bounds are ints, as slots.WithMaxQueue and
// WithMaxQueuePerFlow take them: one past what an int column holds (a
// bound of math.MaxInt, "as good as none") bounds nothing that a queue
// could reach, and the calls work as with no bound. On the server, and
// through PgBouncer in transaction mode.
func TestQueueBoundsBeyondInt32(t *testing.T) {
	srv := pgtest.Start(t)
	t.Run("direct", func(t *testing.T) { queueBoundsBeyondInt32(t, store(t, srv, "direct")) })
	via := srv.Bouncer() // on the test's goroutine: it may skip the test
	t.Run("pgbouncer", func(t *testing.T) { queueBoundsBeyondInt32(t, server{Server: srv, via: via}.Store(t, "bounced")) })
}

func queueBoundsBeyondInt32(t *testing.T, st driver.Store) {
	ctx := context.Background()
	for i, id := range []string{"1", "2", "3"} {
		c := kcall(id, 1, true)
		c.MaxQueue, c.MaxFlowQueue = math.MaxInt, math.MaxInt32+1
		r, err := st.AdmitOne(ctx, c)
		require.NoError(t, err, "call %d", i)
		want := driver.StatusQueued
		if i == 0 {
			want = driver.StatusAdmitted
		}
		assert.Equal(t, want, r.Status, "call %d", i)
	}
}
