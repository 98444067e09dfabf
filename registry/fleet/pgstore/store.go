// Package pgstore keeps a fleet's leases in PostgreSQL: a driver.Store for
// gateway teams that run Postgres and no Redis.
//
//	store, err := pgstore.New(ctx, pool, "gateway") // pool: a *pgxpool.Pool
//	if err != nil {
//		return err // the database unreachable, or its schema newer (ErrSchemaNewer)
//	}
//	caps := fleet.New[string](store, 8)
//	defer caps.Close()
//
// (the package's example is a whole program).
//
// Each operation is one call of a function that New installs (see
// schema.sql and its revisions: budget.sql, units.sql, asks.sql,
// turns.sql, plans.sql, pass.sql, release.sql, serve.sql, count.sql,
// newcomer.sql, budgetfloor.sql, silence.sql, sweep.sql, paused.sql,
// pausedask.sql, sweepdenied.sql, serving.sql, queuedkey.sql,
// lookbound.sql, busykey.sql, resume.sql, servereads.sql and
// admitreads.sql; migrate.go
// makes some of their functions again, as revisions 22 and 23, and grants
// tables, as 24),
// in one transaction of its own: no connection is held by a holder and no
// session state is kept. The rows of keys idle for ten minutes are
// deleted after renewals (sweep.sql), if the role may: give it DELETE
// on inflight_key (without it, the rows stay, and the server's log says
// so, once a second). Behind PgBouncer in transaction mode without its
// prepared statements (before 1.21, or with
// max_prepared_statements = 0), give the pool's connection string
// default_query_exec_mode=exec (pgx's statement cache is session state:
// without it calls fail, with errors that say why). In every case give
// Listen a connection of its own straight to the database
// (WithListenConfig): LISTEN is session state too
// (ExampleWithListenConfig), and Listen logs a warning when it finds that
// what is sent to it does not arrive. The conformance suite is run so,
// through PgBouncer in transaction mode
// (TestConformanceBehindPgBouncer). After a failed login to a database
// that restarts, PgBouncer turns clients away for its server_login_retry
// (15 s by default), and the fleet's calls fail meanwhile. Every time is
// the database's clock_timestamp(), read after the call's lock waits. A
// key's calls lock its row (keys in order, so calls on several keys cannot
// deadlock; other keys of a ticket are taken only if free, never waited
// for); leases are rows whose renewal updates stay HOT. Wake-ups go by
// NOTIFY, received by LISTEN on one connection per process (outside the
// pool); waiters also ask again on their own, so a lost notification
// delays, never strands, a waiter.
//
// Leases weigh units (fleet's AcquireN and the like): a key's count is
// the sum of its leases' units, and lighter waiters pass a heavy one up to
// a bound (see driver.ReleaseCall; schema revision 6), up to slots.MaxUnits
// a lease: a key's count and limit are bigints, and so is a heavy waiter's
// bound since schema revision 22. The units are a column
// of the lease and ticket tables, added with the functions that weigh them
// by schema revision 2 (units.sql), which New makes (see Migrate): nothing
// is to be done by hand. The revision keeps the signatures that the
// release before it calls, as calls of the new functions with 1 unit: a
// process of that release, beside this one in a rolling deploy, counts the
// units of weighted leases right (its admissions, refusals, InFlight and a
// learned cap's evidence are in units) and keeps heavy waiters' order; it
// cannot weigh its own leases. So a fleet that uses weights needs the
// revision, and the processes that weigh at this release; the others may
// stay at the release before until they are replaced.
//
// A call waits for a pooled connection and its key's lock (a waiter's
// call that asks again while no key has room for it, and one that claims
// its grant, do not wait for the lock), so under load it takes longer
// than on Redis: give the fleet a timeout that allows for it
// (fleet.WithTimeout; 2 s rather than the default 500 ms). Calls that
// pass the timeout open the fleet's breaker, and every process then
// admits under its own caps (fleet.WithUnavailable) until it closes.
//
// The calls need READ COMMITTED, PostgreSQL's default: each counts a
// key's leases after waiting for the key's lock, which needs a snapshot
// taken after the wait. Under another isolation level every call fails
// with an error that says so. Grants and learned states are published by
// NOTIFY: a listener that stops reading (a frozen process) fills the
// server's notification queue (8 GB by default) only after a long time;
// pg_notification_queue_usage() tells how full it is.
//
// Lease transactions commit asynchronously by default (Durable turns that
// off): a crash of the server may lose what was committed in its last
// moments (by default, up to three wal_writer_delay), as may a failover to
// a standby that lagged. The fleet then repairs it as after a Redis that
// lost its data: the epoch's marker, in an unlogged table that crash
// recovery empties (and that a standby has empty), is missing, so the next
// call, whoever makes it, starts a new epoch and declares the pause: new
// admissions and hand-offs wait one renewal round while the holders put
// their leases back. (Redis cannot tell a loss from a first start, and
// leaves the pause to the first process that knew the old epoch.) A clean
// restart keeps the marker and loses nothing. A database replaced by an
// empty one (a new cluster, a failover to another database) has no schema:
// every call fails, and is logged, until Migrate makes it again (New
// does); Ping fails meanwhile, so the fleet holds the store unavailable.
// The processes that knew the old epoch then declare the pause, as on
// Redis.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Store is a driver.Store on PostgreSQL. Create it with New.
type Store struct {
	pool   *pgxpool.Pool
	name   string
	async  bool
	retry  time.Duration
	check  time.Duration   // Listen's health check (WithListenCheck)
	listen *pgx.ConnConfig // nil: the pool's
	logger *slog.Logger    // nil: slog.Default()

	mu        sync.Mutex // guards missingAt
	missingAt time.Time  // when a missing schema was last logged (see call)
}

// Option configures a Store; a nil one is ignored.
type Option interface{ apply(*Store) }

// optionFunc adapts a function to Option.
type optionFunc func(*Store)

func (f optionFunc) apply(c *Store) { f(c) }

// Durable commits every lease transaction synchronously: a crash loses
// nothing committed (the epoch still changes, and new admissions wait one
// renewal round), and each call waits for its commit's flush.
func Durable() Option { return optionFunc(func(s *Store) { s.async = false }) }

// WithListenConfig sets the connection Listen makes (default: as the pool
// makes its own, through its BeforeConnect and AfterConnect), e.g. straight
// to the database when the pool goes through PgBouncer in transaction
// mode. Its hooks are not the pool's: its config must name the database
// and the credentials itself.
func WithListenConfig(cfg *pgx.ConnConfig) Option {
	return optionFunc(func(s *Store) { s.listen = cfg })
}

// WithLogger sets the logger (nil, the default: slog.Default()) of what
// the store does on its own: a schema found missing, a Listen that fails.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(s *Store) { s.logger = l }) }

func (s *Store) log() *slog.Logger {
	if s.logger != nil {
		return s.logger
	}
	return slog.Default()
}

// WithListenRetry sets how long Listen waits before it connects again
// after its connection failed (default 1 s). It panics unless d > 0.
func WithListenRetry(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("pgstore: WithListenRetry(%v)", d))
	}
	return optionFunc(func(s *Store) { s.retry = d })
}

// WithListenCheck sets how long Listen's connection may stay quiet before
// Listen checks that it still answers (default 15 s): a connection whose
// peer went without a word (a host gone, a firewall's silent drop) would
// otherwise deliver nothing for ever, and the fleet's waiters would learn
// of their grants only when they ask again. A check that gets no answer
// within the same time (at least a second) makes Listen connect anew, as
// does a connection or its LISTEN that takes that long. (The connection
// given up is closed in the background by pgx, within 15 s.) A check also
// sends a probe to Listen's channel, and a probe that does not arrive
// within that time is logged (see Listen). It panics unless d > 0.
func WithListenCheck(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("pgstore: WithListenCheck(%v)", d))
	}
	return optionFunc(func(s *Store) { s.check = d })
}

// New returns the Store of the fleet name on pool, after bringing the
// database's schema to this release's (see Migrate; a role that may not
// migrate it fails with ErrNotMigrated until its owner has). Every
// process of a fleet uses the same name; fleets with other names share
// the tables. A name is kept as it is, so it must be one that StoredKey
// keeps as it is (New says so otherwise); keys and flows can be any
// strings.
func New(ctx context.Context, pool *pgxpool.Pool, name string, opts ...Option) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: nil pool")
	}
	if !validName(name) {
		return nil, fmt.Errorf("pgstore: fleet name %q: want 1 to %d bytes of UTF-8 without NUL, not starting with `\\x`", name, maxStoredKey)
	}
	s := &Store{pool: pool, name: name, async: true, retry: time.Second, check: 15 * time.Second}
	for _, o := range opts {
		if o == nil {
			continue // a nil option is no option
		}
		o.apply(s)
	}
	if err := Migrate(ctx, pool); err != nil {
		return nil, pooled(err)
	}
	return s, nil
}

// pooled adds a hint to err when it is about a prepared statement that
// one server connection has and another has not: a pooler in
// transaction mode (PgBouncer's) between the pool and the database, with
// pgx's statement cache on.
func pooled(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") {
		return fmt.Errorf("%w (through a pooler in transaction mode, such as PgBouncer's, give the pool's "+
			"connection string default_query_exec_mode=exec)", err)
	}
	return err
}

// missingEvery spaces the errors logged for a missing schema.
const missingEvery = 5 * time.Second

// call runs f, a call to the database, and logs (at most every
// missingEvery) a failure for want of the schema: a database replaced by
// an empty one (a new cluster, a failover to another database) has none,
// and every call fails until it is made again (Migrate: New does, with a
// role that may create it). It is not made again here: a process cannot
// tell that from a connection that does not see the schema (a search_path
// set otherwise), where making one would make a second fleet beside the
// first. Meanwhile Ping fails too, so the fleet holds the store
// unavailable (see fleet.WithUnavailable).
func (s *Store) call(f func() error) error {
	err := f()
	if err == nil {
		return nil // without the allocation of pe, which escapes
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42883" || pe.Code == "42P01") { // undefined function, table
		s.mu.Lock()
		now, log := time.Now(), time.Since(s.missingAt) >= missingEvery
		if log {
			s.missingAt = now
		}
		s.mu.Unlock()
		if log {
			s.log().Error("pgstore: the fleet's schema is missing from the database (replaced by an empty one?); "+
				"run pgstore.Migrate, which New runs, with a role that may create it", slog.String("fleet", s.name), slog.Any("error", err))
		}
	}
	return pooled(err)
}

// String names the fleet, for logs.
func (s *Store) String() string { return "postgres:" + s.name }

// admitSQL is a call that does not wait, or carries pairs; passingSQL a
// waiter's call, which may pass a heavy waiter (pass.sql).
const admitSQL = `SELECT inflight_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)`

const passingSQL = `SELECT inflight_admit_passing($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23)`

// waiterSQL is passingSQL for a waiter's call that carries no pairs: it
// claims a grant without the keys' locks if it can (see inflight_claim).
// COALESCE evaluates inflight_admit_passing only if inflight_claim returns NULL.
const waiterSQL = `SELECT coalesce(inflight_claim($1, $2, $3, $4, $5, $6, $7, $8, $10, $19),
	inflight_admit_passing($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23))`

// AdmitOne makes the call in a transaction of its own.
func (s *Store) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	r := s.admit(ctx, s.pool, c)
	return r, r.Err
}

// Admit makes the calls one after another on one connection, each a
// transaction of its own, so that they run in order. They are not sent in
// one round trip (a pipeline, a Sync after each call): PgBouncer's
// transaction mode may lend the server connection to another client
// between two of a pipeline's transactions when it reads the pipeline in
// pieces, and hand that client a reply meant for this one. On a quiet
// server a pipeline of 16 asks took 9% less time than the same calls one
// by one (see MEASUREMENTS.md in the examples). So the Store is no
// driver.Pipeliner: the fleet sends each claim of a grant alone.
func (s *Store) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	out := make([]driver.AdmitResult, len(calls))
	for i, c := range calls {
		if err := ctx.Err(); err != nil {
			out[i].Err = err
			continue
		}
		out[i] = s.admit(ctx, conn, c)
	}
	return out, nil
}

// querier is a pool or one of its connections.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) admit(ctx context.Context, q querier, c *driver.AdmitCall) driver.AdmitResult {
	var carriedKeys, carriedLeases []string
	var carriedUnits []int32
	for _, p := range c.Carried {
		carriedKeys = append(carriedKeys, StoredKey(p.Key))
		carriedLeases = append(carriedLeases, p.Lease)
		carriedUnits = append(carriedUnits, units(p.Units))
	}
	var res []int64
	sql := admitSQL
	switch {
	case c.Wait && len(c.Carried) == 0:
		sql = waiterSQL
	case c.Wait:
		sql = passingSQL
	}
	err := s.call(func() error {
		return q.QueryRow(ctx, sql, s.name, c.Lease, storedKeys(c.Keys), limits(c.Limits), driver.Millis(c.TTL), c.NotAfter, c.Epoch,
			c.Pause.Milliseconds(), c.Wait, c.Starts, driver.Millis(c.Claim), int16(c.Class), StoredKey(c.Flow), c.Weight, c.Proc,
			bound(c.MaxQueue), bound(c.MaxFlowQueue), c.LiveMillis(), s.async, carriedKeys, carriedLeases, units(c.Units), carriedUnits).Scan(&res)
	})
	return decodeAdmit(c, res, err)
}

// errReply is a reply not shaped as the function's.
var errReply = fmt.Errorf("%w (postgres)", driver.ErrBadReply)

func decodeAdmit(c *driver.AdmitCall, res []int64, err error) driver.AdmitResult {
	if err != nil {
		return driver.AdmitResult{Err: err}
	}
	if len(res) < 7 {
		return driver.AdmitResult{Err: fmt.Errorf("%w: %v", errReply, res)}
	}
	r := driver.AdmitResult{Status: driver.Status(res[0]), Key: int(res[1]) - 1, Count: res[2], Earliest: res[3], Now: res[4], Epoch: res[5], Queue: res[6]}
	if r.Status == driver.StatusAdmitted && c.Starts {
		if len(res) != 7+len(c.Keys) {
			return driver.AdmitResult{Err: fmt.Errorf("%w: %v", errReply, res)}
		}
		r.Start, r.Earliest, r.Counts = res[3], 0, res[7:]
	}
	return r
}

// Renew makes the renewal in one transaction.
func (s *Store) Renew(ctx context.Context, c *driver.RenewCall) (driver.RenewResult, error) {
	n := len(c.Leases)
	ids, modes, epochs, nkeys, us := make([]string, n), make([]int32, n), make([]int64, n), make([]int32, n), make([]int32, n)
	var keys []string
	var ls []int64
	for i, x := range c.Leases {
		ids[i], modes[i], epochs[i], nkeys[i], us[i] = x.Lease, int32(x.Mode), x.Epoch, int32(len(x.Keys)), units(x.Units)
		keys = append(keys, storedKeys(x.Keys)...)
		ls = append(ls, limits(x.Limits)...)
	}
	var res []int64
	err := s.call(func() error {
		return s.pool.QueryRow(ctx, `SELECT inflight_renew($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
			s.name, driver.Millis(c.TTL), c.NotAfter, c.Epoch, c.Pause.Milliseconds(), s.async, ids, modes, epochs, nkeys, keys, ls, us).Scan(&res)
	})
	switch {
	case err != nil:
		return driver.RenewResult{}, err
	case len(res) == 2 && res[0] == int64(driver.StatusTooLate):
		return driver.RenewResult{TooLate: true, Now: res[1]}, nil
	case len(res) != 2+n:
		return driver.RenewResult{}, fmt.Errorf("%w: %v", errReply, res)
	}
	out := driver.RenewResult{Epoch: res[0], Now: res[1], Leases: make([]driver.Fate, n)}
	for i, f := range res[2:] {
		out.Leases[i] = driver.Fate(f)
	}
	s.sweep(ctx)
	return out, nil
}

// Release removes the pairs in one transaction. A TTL of 0 stays 0 (not
// Millis's 1 ms): the call finds no silence (schema revision 12).
func (s *Store) Release(ctx context.Context, c *driver.ReleaseCall) error {
	keys, leases, ls := make([]string, len(c.Pairs)), make([]string, len(c.Pairs)), make([]int64, len(c.Pairs))
	for i, p := range c.Pairs {
		keys[i], leases[i], ls[i] = StoredKey(p.Key), p.Lease, int64(p.Limit)
	}
	var ttl int64
	if c.TTL > 0 {
		ttl = driver.Millis(c.TTL)
	}
	return s.call(func() error {
		_, err := s.pool.Exec(ctx, `SELECT inflight_release($1, $2, $3, $4, $5, $6, $7)`, s.name, driver.Millis(c.Claim), keys, leases, ls, s.async, ttl)
		return err
	})
}

// Abandon makes each abandon a transaction of its own, one after another.
func (s *Store) Abandon(ctx context.Context, calls []*driver.AbandonCall) ([]error, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	errs := make([]error, len(calls))
	for i, c := range calls {
		var ls []int64
		if c.Limits != nil {
			ls = limits(c.Limits)
		}
		errs[i] = s.call(func() error {
			_, err := conn.Exec(ctx, `SELECT inflight_abandon($1, $2, $3, $4, $5, $6, $7, $8)`,
				s.name, c.Lease, storedKeys(c.Keys), ls, driver.Millis(c.TTL), c.NotAfter, driver.Millis(c.Claim), s.async)
			return err
		})
	}
	return errs, nil
}

// Leave deletes proc's liveness.
func (s *Store) Leave(ctx context.Context, proc string) error {
	return s.call(func() error {
		_, err := s.pool.Exec(ctx, `DELETE FROM inflight_proc WHERE fleet = $1 AND proc = $2`, s.name, proc)
		return err
	})
}

// Ping calls one of the schema's functions: a database that answers
// without the schema (replaced by an empty one) fails it, so that the
// fleet holds the store unavailable until Migrate.
func (s *Store) Ping(ctx context.Context) error {
	return s.call(func() error {
		_, err := s.pool.Exec(ctx, `SELECT inflight_now_us()`)
		return err
	})
}

// Count returns the units of key's leases not expired on the database's
// clock.
func (s *Store) Count(ctx context.Context, key string) (int, error) {
	var n int
	err := s.call(func() error {
		return s.pool.QueryRow(ctx, `SELECT inflight_units($1, $2, (inflight_now_us() / 1000))`, s.name, StoredKey(key)).Scan(&n)
	})
	return n, err
}

// SyncLearned reads, and maybe writes, a learned state in one transaction.
func (s *Store) SyncLearned(ctx context.Context, c *driver.LearnedCall) (driver.LearnedResult, error) {
	var res []string
	err := s.call(func() error {
		return s.pool.QueryRow(ctx, `SELECT inflight_learned($1, $2, $3, $4, $5)`, s.name, StoredKey(c.Key), c.Presumed, c.State, driver.Millis(c.TTL)).Scan(&res)
	})
	switch {
	case err != nil:
		return driver.LearnedResult{}, err
	case len(res) == 0:
		return driver.LearnedResult{}, fmt.Errorf("%w: %v", errReply, res)
	case res[0] == "1":
		out := driver.LearnedResult{Wrote: true}
		if len(res) > 1 {
			out.PublishErr = res[1]
		}
		return out, nil
	}
	var out driver.LearnedResult
	if len(res) >= 2 {
		out.Version = res[1]
	}
	if len(res) >= 3 {
		out.State, out.Found = res[2], true
	}
	return out, nil
}

// Budget charges, corrects or checks a budget per minute in one
// transaction. A check is sent as move without correct (budgetCheck).
func (s *Store) Budget(ctx context.Context, c *driver.BudgetCall) (driver.BudgetResult, error) {
	var res []int64
	correct := c.Correct && !c.Check
	err := s.call(func() error {
		return s.pool.QueryRow(ctx, `SELECT inflight_budget($1, $2, $3, $4, $5, $6, $7)`, s.name, StoredKey(c.Key), correct, correct && c.Move || c.Check,
			c.Step, c.Limits[:], c.Cost[:]).Scan(&res)
	})
	if err != nil {
		return driver.BudgetResult{}, err
	}
	return driver.BudgetReply(res)
}
