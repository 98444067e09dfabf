package pgstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
	"github.com/inflight-go/inflight/slots"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// pool returns a pool on srv of at most n connections, closed at cleanup.
func pool(t *testing.T, srv *pgtest.Server, n int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(srv.URL)
	require.NoError(t, err)
	cfg.MaxConns = n
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// store returns the store of the fleet name on srv, on a pool of its own.
func store(t *testing.T, srv *pgtest.Server, name string, opts ...pgstore.Option) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(context.Background(), pool(t, srv, 10), name, opts...)
	require.NoError(t, err)
	return s
}

// process is one process of a fleet on srv: its own pool, store and
// Registry.
func process(t *testing.T, srv *pgtest.Server, name string, limit int, opts ...fleet.Option) *fleet.Registry[string] {
	t.Helper()
	r := fleet.New[string](store(t, srv, name), limit, opts...)
	t.Cleanup(r.Close)
	return r
}

// queued returns the places in the store's queue of key, in the fleet
// (-1 if it cannot tell). It may run on a goroutine of Eventually's: it
// does not stop the test.
func queued(t *testing.T, p *pgxpool.Pool, fleet, key string) int {
	var n int
	if err := p.QueryRow(context.Background(), "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = $2", fleet, key).Scan(&n); !assert.NoError(t, err) {
		return -1
	}
	return n
}

// freedFor waits until r admits under key (then releases at once): a
// release or a withdrawal elsewhere has reached the store.
func freedFor(t *testing.T, r *fleet.Registry[string], key, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		s, err := r.TryAcquire(key)
		if err == nil {
			s.Release()
		}
		return err == nil
	}, 5*time.Second, 5*time.Millisecond, what)
}

// admissions records the order in which waiters are admitted; each
// releases at once.
type admissions struct {
	mu    sync.Mutex
	order []string
	wg    sync.WaitGroup
}

// wait starts a waiter named name on r's key k, under ctx's priority and
// flow.
func (a *admissions) wait(t *testing.T, ctx context.Context, r *fleet.Registry[string], name string) {
	a.wg.Go(func() {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s, err := r.Acquire(ctx, "k")
		if !assert.NoError(t, err, name) {
			return
		}
		a.mu.Lock()
		a.order = append(a.order, name)
		a.mu.Unlock()
		s.Release()
	})
}

// Ten replicas that start at once migrate the schema once, and all work.
func TestMigrateAtOnce(t *testing.T) {
	srv := pgtest.Start(t)
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range errs {
		p := pool(t, srv, 2)
		wg.Go(func() { errs[i] = pgstore.Migrate(context.Background(), p) })
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	var v int
	require.NoError(t, pool(t, srv, 1).QueryRow(context.Background(), "SELECT version FROM inflight_schema").Scan(&v))
	assert.Equal(t, pgstore.SchemaVersion, v)
}

// A database migrated by a newer release is refused with ErrSchemaNewer.
func TestSchemaNewer(t *testing.T) {
	srv := pgtest.Start(t)
	p := pool(t, srv, 2)
	require.NoError(t, pgstore.Migrate(context.Background(), p))
	_, err := p.Exec(context.Background(), "UPDATE inflight_schema SET version = version + 1")
	require.NoError(t, err)
	_, err = pgstore.New(context.Background(), p, "f")
	assert.ErrorIs(t, err, pgstore.ErrSchemaNewer)
}

// Two processes, a limit of 1, 100 concurrent acquires: at most one holds
// at any instant (an independent counter), and every acquire is admitted
// in turn.
func TestAtMostOneActive(t *testing.T) {
	srv := pgtest.Start(t)
	rs := []*fleet.Registry[string]{process(t, srv, "one", 1), process(t, srv, "one", 1)}
	var active, peak atomic.Int32
	var wg sync.WaitGroup
	var admitted atomic.Int32
	for i := range 100 {
		r := rs[i%2]
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s, err := r.Acquire(ctx, "k")
			if !assert.NoError(t, err) {
				return
			}
			n := active.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			admitted.Add(1)
			time.Sleep(2 * time.Millisecond) // the held request's work: a second holder would overlap it
			active.Add(-1)
			s.Release()
		})
	}
	wg.Wait()
	assert.Equal(t, int32(100), admitted.Load())
	assert.Equal(t, int32(1), peak.Load(), "holders at once")
	for _, r := range rs {
		st := r.Stats()
		assert.Zero(t, st.Degraded, "admitted by the store, not locally")
		assert.Zero(t, st.RedisErrors)
	}
}

// A full key refuses TryAcquire with a LimitError naming it; a release
// frees it for the other process.
func TestFullAndRelease(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := process(t, srv, "full", 2), process(t, srv, "full", 2)
	s1, err := a.TryAcquire("k")
	require.NoError(t, err)
	s2, err := b.TryAcquire("k")
	require.NoError(t, err)
	_, err = a.TryAcquire("k")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.True(t, errors.Is(err, slots.ErrLimitReached))
	assert.Equal(t, "k", le.Key)
	assert.Equal(t, 2, le.InFlight)
	n, err := a.InFlight(context.Background(), "k")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	s1.Release()
	freedFor(t, b, "k", "the release reaches the store")
	s2.Release()
}

// A waiter in one process is handed the slot that a holder in another
// releases, by the release's grant and its notification.
func TestHandOff(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := process(t, srv, "hand", 1), process(t, srv, "hand", 1)
	s, err := a.TryAcquire("k")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w, err := b.Acquire(ctx, "k")
		if err == nil {
			w.Release()
		}
		got <- err
	}()
	p := pool(t, srv, 1)
	require.Eventually(t, func() bool { return queued(t, p, "hand", "k") == 1 }, 5*time.Second, time.Millisecond, "its place in the store's queue")
	s.Release()
	require.NoError(t, <-got)
}
