package pgstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A database at revision 16 is brought to 17 (as revision 17's New did): the
// functions revision 17 replaces keep their signatures (no overload is
// added), stay PL/pgSQL, and a connection that ran revision 16's
// functions before runs 17's after.
func TestMigrate16To17KeepsTheFunctions(t *testing.T) {
	s := migratedStore(t, 16, `SELECT inflight_serve('f', 'k', 1, 0, 0, 0)`)
	ctx := context.Background()
	require.Equal(t, driver.StatusAdmitted, admitIn(t, s, kcall("A", 1, false), 10*time.Second).Status)
	require.Equal(t, driver.StatusQueued, admitIn(t, s, kcall("B", 1, true), 10*time.Second).Status)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim, Pairs: []driver.Release{{Key: "k", Lease: "A", Limit: 1}}}))
	countIs(t, s, "k", 1, "B granted")
}

// migratedStore brings a new database to revision from, runs probe there
// (a call of the functions the next revision replaces, whose plans the
// connection then keeps), migrates it to from+1, as that revision's New
// did, and checks that the functions kept their signatures (no overload
// added) and their languages, that the only new ones are added (each as
// "name(types) language"), and the revision. It returns a Store on the
// database, whose New finds nothing more to do than a release's own.
func migratedStore(t *testing.T, from int, probe string, added ...string) *pgstore.Store {
	t.Helper()
	srv := pgtest.Start(t)
	ctx := context.Background()
	p := pool(t, srv, 1)
	require.NoError(t, pgstore.MigrateTo(ctx, p, from))
	before := inflightFunctions(t, p)
	_, err := p.Exec(ctx, probe)
	require.NoError(t, err)
	require.NoError(t, pgstore.MigrateTo(ctx, p, from+1))
	want := slices.Sorted(slices.Values(append(before, added...)))
	assert.Equal(t, want, inflightFunctions(t, p), "revision %d replaces functions under their signatures, in their languages", from+1)
	var r int
	require.NoError(t, p.QueryRow(ctx, "SELECT revision FROM inflight_schema_revision").Scan(&r))
	assert.Equal(t, from+1, r)
	s, err := pgstore.New(ctx, p, fastFleet)
	require.NoError(t, err)
	return s
}

// keysCaller returns call, which admits id on keys (their limits) for
// units on s, waiting if wait.
func keysCaller(t *testing.T, s driver.Store) func(id string, keys []string, units int, limits []int, wait bool) driver.AdmitResult {
	return func(id string, keys []string, units int, limits []int, wait bool) driver.AdmitResult {
		c := kcall(id, 0, wait)
		c.Keys, c.Limits, c.Units = keys, limits, units
		return admitIn(t, s, c, 10*time.Second)
	}
}

// inflightFunctions lists the schema's functions, each with its
// signature and its language, for a revision's test that it replaces
// functions under their signatures (no overload added), in their language.
func inflightFunctions(t *testing.T, p *pgxpool.Pool) []string {
	t.Helper()
	rows, err := p.Query(context.Background(), `SELECT p.oid::regprocedure::text || ' ' || l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.proname LIKE 'inflight\_%' ORDER BY 1`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// Concurrent abandons and releases of leases on the same two keys, given
// in either order, serving their queues, never deadlock.
func TestAbandonsInEitherOrder(t *testing.T) {
	s, _ := fastStore(t)
	ctx := context.Background()
	keys := [][]string{{"a", "b"}, {"b", "a"}}
	// Waiters of both keys and of one, so that serving grants across keys.
	for i := range 6 {
		c := kcall(fmt.Sprint("w", i), 2, true)
		c.Keys, c.Limits = keys[i%2], []int{2, 2}
		if i%3 == 2 {
			c.Keys, c.Limits = []string{"a"}, []int{2}
		}
		admitIn(t, s, c, 10*time.Second)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := range 4 {
		wg.Go(func() {
			for i := range 40 {
				id := fmt.Sprint("g", g, "-", i)
				ks := keys[(g+i)%2]
				c := kcall(id, 3, false)
				c.Keys, c.Limits = ks, []int{3, 3}
				r, err := s.AdmitOne(ctx, c)
				if err != nil {
					errs <- err
					return
				}
				if r.Status != driver.StatusAdmitted {
					continue
				}
				if i%2 == 0 {
					res, err := s.Abandon(ctx, []*driver.AbandonCall{{Lease: id, Keys: slices.Clone(keys[(g+i+1)%2]), Limits: []int{2, 2},
						TTL: fastTTL, Claim: fastClaim}})
					if err == nil {
						err = res[0]
					}
					if err != nil {
						errs <- err
						return
					}
				} else {
					ks2 := keys[(g+i+1)%2]
					if err := s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim, Pairs: []driver.Release{
						{Key: ks2[0], Lease: id, Limit: 2}, {Key: ks2[1], Lease: id, Limit: 2}}}); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
