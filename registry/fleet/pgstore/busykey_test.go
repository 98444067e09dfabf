package pgstore_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/fleettest"
	"github.com/inflight-go/inflight/registry/fleet/pgstore"
	"github.com/inflight-go/inflight/registry/fleet/pgstore/pgtest"
)

// A waiter's ask on several keys locks them in their order (inflight_lock)
// and waits for a key that a release holds: the release, serving that
// key's queue, finds the waiter's other key busy (inflight_trylock fails).
// That waiter, H (8 units on {tokens, a}), fits tokens once the release
// frees it; a light waiter behind it, L (3 units on {tokens, b}), does not
// fit beside it. The busy key is not a want of room: H keeps tokens' room
// (the ask that holds a serves tokens once the release commits), and L is
// not granted past it (fleettest's HeavyWaiterFirstOnSeveralKeys, which
// failed once behind PgBouncer with L admitted first).
//
// The serving also wakes H (a Granted for its ticket, though nothing is
// granted yet): when the call holding a is not H's own ask, H asks again
// now rather than at its next look, a claim window later, with tokens'
// room idle meanwhile.
func TestBusyKeyKeepsTheWaitersRoom(t *testing.T) {
	srv := pgtest.Start(t)
	s, admin := store(t, srv, fastFleet), pool(t, srv, 2)
	ctx := context.Background()
	call := keysCaller(t, s)
	heavy := func() driver.AdmitResult { return call("H", []string{"tokens", "a"}, 8, []int{10, 10}, true) }
	light := func() driver.AdmitResult { return call("L", []string{"tokens", "b"}, 3, []int{10, 3}, true) }
	require.Equal(t, driver.StatusAdmitted, call("G", []string{"tokens"}, 6, []int{10}, false).Status)
	require.Equal(t, driver.StatusAdmitted, call("B", []string{"b"}, 1, []int{3}, false).Status)
	require.Equal(t, driver.StatusQueued, heavy().Status)
	require.Equal(t, driver.StatusQueued, light().Status)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "b", Lease: "B", Limit: 3}}}))
	countIs(t, s, "tokens", 6, "L stands behind H on tokens")

	// H's ask under way: a locked, tokens waited for.
	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SELECT inflight_lock($1, $2)", fastFleet, []string{pgstore.StoredKey("a")})
	require.NoError(t, err)
	woken := listen(t, s, "p")
	require.Eventually(t, func() bool { return woken.listening.Load() > 0 }, 10*time.Second, time.Millisecond, "listens")
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "tokens", Lease: "G", Limit: 10}}}))
	require.Eventually(t, func() bool { return woken.granted.Load() > 0 }, 10*time.Second, time.Millisecond,
		"H woken to ask again, with a still held")
	countIs(t, s, "tokens", 0, "tokens' room kept for H, granted to nobody")
	require.NoError(t, tx.Rollback(ctx))

	assert.Equal(t, driver.StatusAdmitted, heavy().Status, "H, first on tokens, is admitted by its ask")
	assert.Equal(t, driver.StatusQueued, light().Status, "L waits for H's units")
	countIs(t, s, "tokens", 8, "H's 8 units")
}

// fleettest's HeavyWaiterFirstOnSeveralKeys, with the heavy waiter's own
// ask under way as the holder's release on tokens is served: the release
// holds tokens (its deletion of the holder's lease held up by the test),
// the heavy waiter asks again (SetLimit wakes it), locks a and waits for
// tokens; then the release goes on and serves tokens. The heavy waiter is
// admitted first.
func TestHeavyWaiterFirstWithItsOwnAskUnderWay(t *testing.T) {
	srv := pgtest.Start(t)
	admin := pool(t, srv, 2)
	const name = "heavyall"
	mk := func() *fleet.Registry[string] {
		r := fleet.New[string](fleettest.Patient(store(t, srv, name)), 10, fleet.WithTimeout(5*time.Second))
		t.Cleanup(r.Close)
		r.SetLimit("b", 3)
		return r
	}
	holder, heavy, light := mk(), mk(), mk()
	queuedIs := func(n int) {
		require.Eventually(t, func() bool {
			var got int
			err := admin.QueryRow(context.Background(), "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = 'tokens'", name).Scan(&got)
			return err == nil && got == n
		}, 10*time.Second, time.Millisecond)
	}
	waitersAre := func(n int, what string) {
		require.Eventually(t, func() bool { return lockWaiters(t, admin) == n }, 10*time.Second, time.Millisecond, what)
	}
	held, err := holder.TryAcquireN("tokens", 6)
	require.NoError(t, err)
	onB, err := holder.TryAcquire("b")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	wait := func(r *fleet.Registry[string], who string, n int, keys ...string) {
		wg.Go(func() {
			s, err := r.AcquireAllN(ctx, n, keys...)
			if !assert.NoError(t, err, who) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			order = append(order, who)
			s.Release()
		})
	}
	wait(heavy, "heavy", 8, "tokens", "a")
	queuedIs(1)
	wait(light, "light", 3, "tokens", "b")
	queuedIs(2)
	onB.Release()
	require.Eventually(t, func() bool {
		n, err := light.InFlight(context.Background(), "b")
		return err == nil && n == 0
	}, 10*time.Second, 5*time.Millisecond)
	n, err := light.InFlight(context.Background(), "tokens")
	require.NoError(t, err)
	require.Equal(t, 6, n, "tokens' room kept for the heavy waiter")

	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var one int
	require.NoError(t, tx.QueryRow(ctx, "SELECT 1 FROM inflight_lease WHERE fleet = $1 AND key = 'tokens' AND units = 6 FOR UPDATE", name).Scan(&one))
	waitersAre(0, "nobody waits yet")
	held.Release()
	waitersAre(1, "the release holds tokens, and waits for the holder's lease")
	heavy.SetLimit("a", 10) // the same limit: the heavy waiter asks again
	waitersAre(2, "the heavy waiter's ask holds a, and waits for tokens")
	require.NoError(t, tx.Rollback(ctx))
	wg.Wait()
	assert.Equal(t, []string{"heavy", "light"}, order)
}

// A database at revision 19 is brought to 20: the function revision 20
// replaces (inflight_serve) keeps its signature and stays PL/pgSQL, a
// connection that ran revision 19's before runs 20's after, and a release
// serves a waiter of several keys behind it.
func TestMigrate19To20KeepsTheFunctions(t *testing.T) {
	s := migratedStore(t, 19, `SELECT inflight_serve('f', 'k', 1, 0, 0, 0)`)
	call := keysCaller(t, s)
	require.Equal(t, driver.StatusAdmitted, call("G", []string{"tokens"}, 6, []int{10}, false).Status)
	require.Equal(t, driver.StatusQueued, call("H", []string{"tokens", "a"}, 8, []int{10, 10}, true).Status)
	require.NoError(t, s.Release(context.Background(), &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "tokens", Lease: "G", Limit: 10}}}))
	countIs(t, s, "tokens", 8, "H granted by the release")
}

type caller = func(id string, keys []string, units int, limits []int, wait bool) driver.AdmitResult

// busyKeyServing queues H (hUnits on {tokens, a}, its limits hLimits)
// and then L (3 units on {tokens, b}) behind tokens' holders, locks a as
// a call under way would, and releases G's units on tokens under a limit
// of 10. It returns tokens' count after that release, a still held.
func busyKeyServing(t *testing.T, setup func(call caller, admin *pgxpool.Pool),
	gUnits, hUnits int, hLimits []int) int {
	t.Helper()
	srv := pgtest.Start(t)
	s, admin := store(t, srv, fastFleet), pool(t, srv, 2)
	ctx := context.Background()
	call := keysCaller(t, s)
	setup(call, admin)
	require.Equal(t, driver.StatusAdmitted, call("G", []string{"tokens"}, gUnits, []int{10}, false).Status)
	require.Equal(t, driver.StatusQueued, call("H", []string{"tokens", "a"}, hUnits, hLimits, true).Status)
	require.Equal(t, driver.StatusQueued, call("L", []string{"tokens", "b"}, 3, []int{10, 10}, true).Status)

	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, "SELECT inflight_lock($1, $2)", fastFleet, []string{pgstore.StoredKey("a")})
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, &driver.ReleaseCall{TTL: fastTTL, Claim: fastClaim,
		Pairs: []driver.Release{{Key: "tokens", Lease: "G", Limit: 10}}}))
	n, err := s.Count(ctx, "tokens")
	require.NoError(t, err)
	return n
}

// H stands behind a heavy waiter on a (HW, 8 units where 3 are held):
// once a is free it is still passed over there (inflight_behind_heavy),
// so a busy a is no reason to keep tokens' room for it. L is granted, as
// it is with a free.
func TestBusyKeyBehindAHeavyWaiterKeepsNothing(t *testing.T) {
	n := busyKeyServing(t, func(call caller, _ *pgxpool.Pool) {
		require.Equal(t, driver.StatusAdmitted, call("A", []string{"a"}, 3, []int{10}, false).Status)
		require.Equal(t, driver.StatusQueued, call("HW", []string{"a"}, 8, []int{10}, true).Status)
	}, 10, 2, []int{10, 10})
	require.Equal(t, 3, n, "L granted: H cannot be served on a (a heavy waiter before it), busy or not")
}

// H's own limit on tokens (9) leaves it no room for its 8 units beside
// Y's 2: serving under 10 passes it over there (inflight_can_take under
// its limits), busy a or not. L is granted.
func TestBusyKeyUnderTheWaitersOwnLimitKeepsNothing(t *testing.T) {
	n := busyKeyServing(t, func(call caller, _ *pgxpool.Pool) {
		require.Equal(t, driver.StatusAdmitted, call("Y", []string{"tokens"}, 2, []int{10}, false).Status)
	}, 8, 8, []int{9, 10})
	require.Equal(t, 2+3, n, "L granted: H has no room on tokens under its own limit")
}

// U (6 units on {a, c}, c full), older than H and urgent, has a's place
// kept for it: beside A's 3 units, H's 2 find no room on a (inflight_room),
// busy a or not. L is granted.
func TestBusyKeyWithAnUrgentPlaceKeepsNothing(t *testing.T) {
	n := busyKeyServing(t, func(call caller, admin *pgxpool.Pool) {
		require.Equal(t, driver.StatusAdmitted, call("A", []string{"a"}, 3, []int{10}, false).Status)
		require.Equal(t, driver.StatusAdmitted, call("C", []string{"c"}, 1, []int{1}, false).Status)
		require.Equal(t, driver.StatusQueued, call("U", []string{"a", "c"}, 6, []int{10, 1}, true).Status)
		// Passed over maxPassed times (as grants past it would make it).
		_, err := admin.Exec(context.Background(), "UPDATE inflight_ticket SET urgent = true WHERE fleet = $1 AND ticket = 'U'", fastFleet)
		require.NoError(t, err)
	}, 10, 2, []int{10, 10})
	require.Equal(t, 3, n, "L granted: a's room is U's place, H has none there")
}

// BenchmarkBusyKeyHandOff measures the wait of a waiter of several keys
// (8 units on {tokens, a}, limits 10) whose grant was held up by a key
// another call held: a release frees tokens while a transaction holds a;
// ns/op runs from that transaction's end to the waiter's admission. The
// serving's wake-up (busykey.sql) has the waiter ask at once; without it,
// the waiter would ask at its next look, a claim window later. Run it with
//
//	go test -run '^$' -bench BusyKeyHandOff -benchtime 20x ./registry/fleet/pgstore
func BenchmarkBusyKeyHandOff(b *testing.B) {
	srv := pgtest.Start(b)
	admin := pool(b, srv, 2)
	const name = "handoff"
	waiter := fleet.New[string](store(b, srv, name), 10)
	b.Cleanup(waiter.Close)
	holder := fleet.New[string](store(b, srv, name), 10)
	b.Cleanup(holder.Close)
	ctx := context.Background()
	count := func(q string) int {
		var n int
		require.NoError(b, admin.QueryRow(ctx, q, name).Scan(&n))
		return n
	}
	until := func(q string, n int) {
		for count(q) != n {
			runtime.Gosched()
		}
	}
	const queued = "SELECT count(*) FROM inflight_ticket WHERE fleet = $1 AND key = 'tokens'"
	const leased = "SELECT coalesce(sum(units), 0) FROM inflight_lease WHERE fleet = $1 AND key = 'tokens'"
	for b.Loop() {
		b.StopTimer()
		held, err := holder.TryAcquireN("tokens", 6)
		require.NoError(b, err)
		admitted := make(chan error, 1)
		go func() {
			s, err := waiter.AcquireAllN(ctx, 8, "tokens", "a")
			if err == nil {
				s.Release()
			}
			admitted <- err
		}()
		until(queued, 1)
		tx, err := admin.Begin(ctx)
		require.NoError(b, err)
		_, err = tx.Exec(ctx, "SELECT inflight_lock($1, $2)", name, []string{pgstore.StoredKey("a")})
		require.NoError(b, err)
		held.Release()
		until(leased, 0) // released, and tokens' queue served while a is held
		b.StartTimer()
		require.NoError(b, tx.Rollback(ctx))
		require.NoError(b, <-admitted)
		b.StopTimer()
		until(leased, 0)
		b.StartTimer()
	}
}
