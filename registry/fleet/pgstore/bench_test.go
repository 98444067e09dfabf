package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
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

// The benchmarks measure the store's own calls on one real server (fsync
// on), beside a bare semaphore on the same server, with synchronous and
// asynchronous commits: the design the fleet's Postgres leases come from
// (a transaction advisory lock per key, a COUNT, an INSERT; a DELETE to
// release). Run them with
//
//	go test -run '^$' -bench . -benchtime 3s ./registry/fleet/pgstore
//
// Each reports pairs/s (an admission and its release) and the median
// admission's latency; BenchmarkAsks, a queued waiter's calls while its
// key stays full.

func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// semaphore is one way to take and give back a place on a key of cap n.
type semaphore interface {
	take(ctx context.Context, key, id string, n int) (bool, error)
	give(ctx context.Context, key, id string, n int) error
}

// storeSem is the pgstore Store's admission and release calls: a
// TryAcquire's, or, with wait, an Acquire's first call (which would queue
// if the key were full).
type storeSem struct {
	s    *pgstore.Store
	wait bool
}

func (x storeSem) take(ctx context.Context, key, id string, n int) (bool, error) {
	r, err := x.s.AdmitOne(ctx, &driver.AdmitCall{Lease: id, Keys: []string{key}, Limits: []int{n}, TTL: time.Minute, Weight: 1,
		Claim: time.Second, Live: 5 * time.Second, MaxQueue: -1, MaxFlowQueue: -1, Wait: x.wait, Proc: "bench"})
	return err == nil && r.Status == driver.StatusAdmitted, err
}

func (x storeSem) give(ctx context.Context, key, id string, n int) error {
	return x.s.Release(ctx, &driver.ReleaseCall{Claim: time.Second, Pairs: []driver.Release{{Key: key, Lease: id, Limit: n}}})
}

// bareSem is the bare semaphore: an advisory lock per key, count, insert.
type bareSem struct{ p *pgxpool.Pool }

func (x bareSem) take(ctx context.Context, key, id string, n int) (bool, error) {
	var ok bool
	err := x.p.QueryRow(ctx, `WITH l AS (SELECT pg_advisory_xact_lock(hashtext($1))),
		c AS (SELECT count(*) AS n FROM bare_lease, l WHERE key = $1 AND expires > clock_timestamp())
		INSERT INTO bare_lease SELECT $1, $2, clock_timestamp() + interval '1 minute' FROM c WHERE c.n < $3 RETURNING true`,
		key, id, n).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) { // full: nothing inserted
		return false, nil
	}
	return ok, err
}

func (x bareSem) give(ctx context.Context, key, id string, _ int) error {
	_, err := x.p.Exec(ctx, `DELETE FROM bare_lease WHERE key = $1 AND lease = $2`, key, id)
	return err
}

// benchPairs runs callers goroutines, each taking and giving back a
// place on one key of cap n as fast as it can, and reports pairs/s and
// the median admission's latency.
func benchPairs(b *testing.B, sem semaphore, callers, n int) {
	ctx := context.Background()
	timeCalls(b, callers, "pairs/s", func(int) (time.Duration, error) {
		id := newID()
		t0 := time.Now()
		ok, err := sem.take(ctx, "hot", id, n)
		took := time.Since(t0)
		if err == nil && ok {
			err = sem.give(ctx, "hot", id, n)
		}
		return took, err
	})
}

// timeCalls runs workers goroutines that share b.N calls of f (given the
// worker's index; it returns the latency to count, or an error that
// stops its worker), and reports the calls per second as unit and the
// median latency. The timer is stopped when it returns.
func timeCalls(b *testing.B, workers int, unit string, f func(worker int) (time.Duration, error)) {
	var mu sync.Mutex
	var lat []time.Duration
	per := max(b.N/workers, 1)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			mine := make([]time.Duration, 0, per)
			for range per {
				d, err := f(w)
				if err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, d)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(len(lat))/elapsed.Seconds(), unit)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	}
}

func BenchmarkPairs(b *testing.B) {
	srv := pgtest.Start(b)
	cfg, err := pgxpool.ParseConfig(srv.URL)
	require.NoError(b, err)
	cfg.MaxConns = 64
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(p.Close)
	_, err = p.Exec(context.Background(), `CREATE TABLE bare_lease (key text, lease text, expires timestamptz, PRIMARY KEY (key, lease))`)
	require.NoError(b, err)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pAsync, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pAsync.Close)
	async, err := pgstore.New(context.Background(), p, "async")
	require.NoError(b, err)
	durable, err := pgstore.New(context.Background(), p, "durable", pgstore.Durable())
	require.NoError(b, err)
	for _, callers := range []int{1, 64} {
		for _, tc := range []struct {
			name string
			sem  semaphore
		}{
			{"bare-semaphore", bareSem{p}},
			{"bare-semaphore-async", bareSem{pAsync}},
			{"pgstore-async", storeSem{s: async}},
			{"pgstore-async-waiter", storeSem{s: async, wait: true}},
			{"pgstore-durable", storeSem{s: durable}},
		} {
			b.Run(tc.name+"/callers-"+strconv.Itoa(callers), func(b *testing.B) { benchPairs(b, tc.sem, callers, 64) })
		}
	}
}

// BenchmarkAsks measures the calls a queued waiter makes while its key
// stays full (it asks again within each claim window, in case a wake-up
// was lost): most of a full key's calls, answered without the key's lock
// (see inflight_still_queued). The key's one place is held, and each
// caller is a waiter of its own, queued behind it. After each run, every
// caller asks once more while another transaction holds the key's row,
// and a call that waits a second for it fails: an ask that takes the
// locked path fails the benchmark. (Holding the row during the run would
// slow the asks: an open transaction keeps the rows they update from
// being cleaned up.) It reports asks/s and the median ask's latency.
func BenchmarkAsks(b *testing.B) {
	srv := pgtest.Start(b)
	cfg, err := pgxpool.ParseConfig(srv.URL)
	require.NoError(b, err)
	cfg.MaxConns = 64
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "1s"
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(p.Close)
	s, err := pgstore.New(context.Background(), p, "asks")
	require.NoError(b, err)
	ctx := context.Background()
	call := func(id string, epoch int64) *driver.AdmitCall {
		return &driver.AdmitCall{Lease: id, Keys: []string{"hot"}, Limits: []int{1}, TTL: time.Hour, Weight: 1, Epoch: epoch,
			Claim: time.Second, Live: time.Hour, MaxQueue: -1, MaxFlowQueue: -1, Wait: true, Proc: "bench"}
	}
	holder, err := s.AdmitOne(ctx, call(newID(), 0))
	require.NoError(b, err)
	require.Equal(b, driver.StatusAdmitted, holder.Status)
	for _, callers := range []int{1, 16} {
		ids := make([]string, callers)
		for i := range ids {
			ids[i] = newID()
			r, err := s.AdmitOne(ctx, call(ids[i], holder.Epoch))
			require.NoError(b, err)
			require.Equal(b, driver.StatusQueued, r.Status)
		}
		b.Run("callers-"+strconv.Itoa(callers), func(b *testing.B) {
			timeCalls(b, callers, "asks/s", func(w int) (time.Duration, error) {
				t0 := time.Now()
				r, err := s.AdmitOne(ctx, call(ids[w], holder.Epoch))
				if err == nil && r.Status != driver.StatusQueued {
					err = fmt.Errorf("ask: %+v", r)
				}
				return time.Since(t0), err
			})
			tx, err := p.Begin(ctx)
			require.NoError(b, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SELECT 1 FROM inflight_key WHERE fleet = 'asks' AND key = 'hot' FOR UPDATE")
			require.NoError(b, err)
			for _, id := range ids {
				r, err := s.AdmitOne(ctx, call(id, holder.Epoch))
				require.NoError(b, err, "an ask waited for the key's lock")
				require.Equal(b, driver.StatusQueued, r.Status)
			}
			require.NoError(b, tx.Rollback(ctx))
		})
	}
}

// BenchmarkFleet runs the conformance suite's measurements
// (fleettest.Bench) on a real PostgreSQL server:
//
//	go test -run '^$' -bench Fleet -benchtime 1x ./registry/fleet/pgstore
func BenchmarkFleet(b *testing.B) {
	srv := pgtest.Start(b)
	fleettest.Bench(b, server{Server: srv, admin: pool(b, srv, 1)})
}
