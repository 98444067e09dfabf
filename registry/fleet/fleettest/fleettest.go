// Package fleettest is the conformance suite of the fleet's store
// contract (package driver): the tests any store passes, run against real
// servers of it. A store's module runs it from a test of its own:
//
//	func TestConformance(t *testing.T) {
//		fleettest.Run(t, func(t *testing.T) fleettest.Server { return myServer(t) })
//	}
//
// Each test runs fleets of two or more processes (fleet.Registry values,
// each on a store of its own from Server.Store) and checks what a user of
// the fleet relies on: the cap under concurrency, hand-off, renewal and
// expiry, all-or-nothing admission on several keys, keys of any bytes, live
// limit changes, the fleet-wide order (classes, weighted flows), learned
// caps, shared overrides, shared budgets per minute; when the server is
// Proxied, a process cut off from it past the lease TTL; and, when it
// offers Faults, the cap across a crash, a hang past the lease TTL and a
// loss of the store's data, and what each Unavailable mode does while the
// store cannot be reached. A few tests call the store's own operations
// (driver.Store) as one process would, for the order rules of a serving
// that a fleet of processes only shows now and then, and for promises of
// the contract the client leans on that it shows as rarely (a call past
// its NotAfter, an abandoned lease, a renewal, a pause, a process gone,
// the queue's bounds, a claimed grant, a release's pairs, a learned
// state's compare-and-write).
//
// The tests run on real clocks: they assert what must hold whatever the
// machine's load, with generous bounds on how long it may take. Bench
// measures what they do not assert (how well a store keeps a cache of
// tokens used), as benchmarks. Beside Run, a store's own tests may call
// Patient (its calls' claims stretched, for order tests through
// fleet.Registry on a busy machine) and UrgentPastTheLookBound (for a
// store that keeps a place for a waiter passed over many times, which the
// contract does not ask).
package fleettest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet"
	"github.com/inflight-go/inflight/registry/fleet/driver"
)

// Server is a running server of a store, as the suite drives it.
type Server interface {
	// Store returns a new client of the server for one process of the
	// fleet named fleet, with connections of its own, closed at t's
	// cleanup. Fleets of different names must not meet.
	Store(t testing.TB, fleet string) driver.Store
	// Queued returns how many tickets wait in the fleet's queue of key
	// (any string: see the AnyKey test). It may be called from a goroutine
	// other than the test's.
	Queued(fleet, key string) (int, error)
}

// Faults are the faults a Server can suffer. A Server without them runs
// the suite less its fault tests (which it logs).
type Faults interface {
	// Kill stops the server at once (SIGKILL), as a crash would, and
	// waits for it to exit; Restart starts it again, with whatever it
	// keeps on disk, and returns once it answers.
	Kill()
	Restart()
	// Stop hangs the server (SIGSTOP): its connections stay open and
	// calls to it wait. Cont resumes it.
	Stop()
	Cont()
	// Lose makes the running server lose every fleet's data, as a
	// restart without persistence or a failover to an empty replica does.
	Lose()
}

// Proxied is a Server whose stores can reach it at another address: the
// suite puts a proxy there, to cut the network between one process and the
// server. A Server without it runs the suite less the network cut test.
type Proxied interface {
	// Address is the server's TCP address, host:port.
	Address() string
	// StoreVia is Store, connecting to addr in place of Address.
	StoreVia(t testing.TB, fleet, addr string) driver.Store
}

// Run runs the suite, each test as a subtest of t. start starts a server
// for t, stopped at t's cleanup: one is shared by the tests that need no
// fault, and each fault test has one of its own.
func Run(t *testing.T, start func(t *testing.T) Server) {
	shared := start(t)
	for _, c := range plain {
		t.Run(c.name, func(t *testing.T) { c.run(t, shared) })
	}
	if _, ok := shared.(Faults); !ok {
		t.Logf("fleettest: %T has no Faults: the fault tests are not run", shared)
		return
	}
	for _, c := range faulty {
		t.Run(c.name, func(t *testing.T) { c.run(t, start(t)) })
	}
}

type test struct {
	name string
	run  func(t *testing.T, srv Server)
}

// The suite: tests on a shared server, each on a fleet of its own name,
// and tests that hurt their server.
var (
	plain = []test{
		{"AtMostOneActive", atMostOneActive},
		{"FullAndRelease", fullAndRelease},
		{"HandOff", handOff},
		{"RenewAndExpiry", renewAndExpiry},
		{"AcquireAll", acquireAll},
		{"WaiterGivesUp", waiterGivesUp},
		{"LiveLimits", liveLimits},
		{"ClassOrder", classOrder},
		{"WeightedTurns", weightedTurns},
		{"TurnsMeetByArrival", turnsMeetByArrival},
		{"TurnsInUnits", turnsInUnits},
		{"LeaversAreNotCharged", leaversAreNotCharged},
		{"NewcomerDoesNotPass", newcomerDoesNotPass},
		{"LearnedCapShared", learnedCapShared},
		{"CountsLeaveOutGrants", countsLeaveOutGrants},
		{"AdmittedOverALoweredLimit", admittedOverALoweredLimit},
		{"ExpiredLeasePasses", expiredLeasePasses},
		{"SilenceKeepsLeases", silenceKeepsLeases},
		{"PausedAskKeepsItsPlace", pausedAskKeepsItsPlace},
		{"AnyKey", anyKey},
		{"KeysNamedLikeAStoresOwn", keysNamedLikeAStoresOwn},
		{"FlowsNamedLikeAClasssCounts", flowsNamedLikeAClasssCounts},
		{"OverridesShared", overridesShared},
		{"BudgetShared", budgetShared},
		{"BudgetRequests", budgetRequests},
		{"BudgetCorrectionsFloor", budgetCorrectionsFloor},
		{"BudgetCheck", budgetCheck},
		{"UnitsCap", unitsCap},
		{"UnitsCounted", unitsCounted},
		{"HeavyWaiterFirst", heavyWaiterFirst},
		{"HeavyWaiterPassedByOtherFlows", heavyWaiterPassedByOtherFlows},
		{"HeavyWaiterFirstOnSeveralKeys", heavyWaiterFirstOnSeveralKeys},
		{"HeavyWaiterOfManyUnits", heavyWaiterOfManyUnits},
		{"HeavyWaiterOfManyUnitsAsked", heavyWaiterOfManyUnitsAsked},
		{"ExceedsLimit", exceedsLimit},
		{"UnitsPutBack", unitsPutBack},
		{"BatchRelease", batchRelease},
		{"LargeAmongSmall", largeAmongSmall},
		{"PassBoundWithinOneServing", passBoundWithinOneServing},
		{"NewcomerDoesNotPassAtBound", newcomerDoesNotPassAtBound},
		{"OwnCallGrantOnLaterKey", ownCallGrantOnLaterKey},
		{"AbandonServesAfterRemovingAll", abandonServesAfterRemovingAll},
		{"RefusalNamesTheFirstKey", refusalNamesTheFirstKey},
		{"QueuedNamesTheKeyItWaitsOn", queuedNamesTheKeyItWaitsOn},
		{"QueuedAskNamesTheKeyItWaitsOn", queuedAskNamesTheKeyItWaitsOn},
		{"RaisedLimitServedOnAsk", raisedLimitServedOnAsk},
		{"DroppedWaiterIsANewcomer", droppedWaiterIsANewcomer},
		{"SeveralKeysWaiterTurnsHeavy", severalKeysWaiterTurnsHeavy},
		{"SeveralKeysWaiterBeforeTheLookBound", severalKeysWaiterBeforeTheLookBound},
		{"SeveralKeysWaiterSlidBeforeTheLookBound", severalKeysWaiterSlidBeforeTheLookBound},
		{"LightWaiterSlidBeforeTheLookBound", lightWaiterSlidBeforeTheLookBound},
		{"GivenBackLeavesEveryKeyFirst", givenBackLeavesEveryKeyFirst},
		{"OddKeysSeveral", oddKeysSeveral},
		{"NotAfterChangesNothing", notAfterChangesNothing},
		{"AbandonedStaysOut", abandonedStaysOut},
		{"AbandonWithLimitsServes", abandonWithLimitsServes},
		{"RenewalBringsBackNothing", renewalBringsBackNothing},
		{"PauseHoldsQueuesAndPutBacks", pauseHoldsQueuesAndPutBacks},
		{"LeftProcessIsNotGranted", leftProcessIsNotGranted},
		{"QueueBoundsExact", queueBoundsExact},
		{"ClaimedGrantHoldsForTTL", claimedGrantHoldsForTTL},
		{"ReleaseRemovesOnlyItsPairs", releaseRemovesOnlyItsPairs},
		{"CarriedPutBackWithUnits", carriedPutBackWithUnits},
		{"LearnedCompareAndWrite", learnedCompareAndWrite},
		{"NetworkCut", networkCut},
	}
	faulty = []test{
		{"Killed", killed},
		{"Lost", lost},
		{"BudgetLost", budgetLost},
		{"StoppedPastTTL", stoppedPastTTL},
		{"Unavailable", unavailable},
	}
)

// wait bounds how long the suite waits for what a fleet does on its own
// (a release reaching the other process, a renewal round): long, for
// busy machines.
const wait = 10 * time.Second

// process is one process of the fleet name on srv: its own store and
// Registry, closed at t's cleanup.
func process(t testing.TB, srv Server, name string, limit int, opts ...fleet.Option) *fleet.Registry[string] {
	t.Helper()
	r := fleet.New[string](srv.Store(t, name), limit, opts...)
	t.Cleanup(r.Close)
	return r
}

// processes is n processes of the fleet name on srv.
func processes(t testing.TB, srv Server, name string, n, limit int, opts ...fleet.Option) []*fleet.Registry[string] {
	t.Helper()
	rs := make([]*fleet.Registry[string], n)
	for i := range rs {
		rs[i] = process(t, srv, name, limit, opts...)
	}
	return rs
}

// queuedIs waits until n tickets wait in the fleet's queue of key.
func queuedIs(t *testing.T, srv Server, name, key string, n int) {
	t.Helper()
	var mu sync.Mutex
	var last int
	var err error
	if !assert.Eventually(t, func() bool {
		got, e := srv.Queued(name, key)
		mu.Lock()
		defer mu.Unlock()
		last, err = got, e
		return e == nil && got == n
	}, wait, time.Millisecond) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d in the store's queue of %s: last seen %d, %v", n, key, last, err)
	}
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
	}, wait, 5*time.Millisecond, what)
}

// inFlightIs waits until the store counts n leases on key.
func inFlightIs(t *testing.T, r *fleet.Registry[string], key string, n int, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		got, err := r.InFlight(context.Background(), key)
		return err == nil && got == n
	}, wait, 5*time.Millisecond, what)
}

// admissions records the order in which waiters are admitted, and the
// errors of those that are not; each releases at once. Its waiters end
// with the test (see newAdmissions), and only the test's goroutine
// asserts.
type admissions struct {
	ctx   context.Context
	mu    sync.Mutex
	order []string
	errs  []error
	wg    sync.WaitGroup
}

// newAdmissions returns admissions whose waiters are cancelled and waited
// for at t's cleanup, before the processes made earlier close.
func newAdmissions(t *testing.T) *admissions {
	ctx, cancel := context.WithCancel(context.Background())
	a := &admissions{ctx: ctx}
	t.Cleanup(func() {
		cancel()
		a.wg.Wait()
	})
	return a
}

// wait starts a waiter named name on r's key "k", its context's priority
// and flow set by place.
func (a *admissions) wait(place func(context.Context) context.Context, r *fleet.Registry[string], name string) {
	a.wg.Go(func() {
		ctx, cancel := context.WithTimeout(a.ctx, 3*wait)
		defer cancel()
		s, err := r.Acquire(place(ctx), "k")
		a.mu.Lock()
		defer a.mu.Unlock()
		if err != nil {
			a.errs = append(a.errs, fmt.Errorf("%s: %w", name, err))
			return
		}
		a.order = append(a.order, name)
		s.Release()
	})
}

// done waits for every waiter, and returns the admission order once none
// failed.
func (a *admissions) done(t *testing.T) []string {
	t.Helper()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, err := range a.errs {
		t.Error(err)
	}
	return a.order
}

// raise makes peak at least n.
func raise(peak *atomic.Int32, n int32) {
	for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
	}
}
