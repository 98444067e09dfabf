package fleet

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/pacing/upstream"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// These faults were found by a bug hunt with stores that fail or stall
// one call at a chosen moment.

var errInjected = errors.New("test: the store's call failed")

// A lease admitted outside the store (one call failed, the breaker still
// closed) while another caller's call is on its way counts for that
// call's admission: the store, which did not count it, admitted the other,
// which is then refused and taken back. Before, the process held two slots
// of a key limited to 1, and its heartbeat put the second into the store
// without a check.
func TestLeaseAdmittedOutsideTheStoreMeanwhileCounts(t *testing.T) {
	ms := memstore.New()
	st := &heldWhenArmed{Store: ms, arrived: make(chan struct{}), open: make(chan struct{})}
	r := New[string](st, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet())) // FallbackLocal
	defer closeWithin(t, r)
	local, err := whileHeld(t, r, st, func() (*slots.Slot, error) { return r.TryAcquire("k") }, "k")
	assert.ErrorIs(t, err, slots.ErrLimitReached, "the store admitted it without the lease held outside")
	assert.False(t, r.Stats().BreakerOpen)
	assert.Equal(t, 1, r.Stats().Held)
	local.Release()
	require.Eventually(t, func() bool {
		n, err := ms.Count(context.Background(), "k")
		return err == nil && n == 0
	}, 5*time.Second, time.Millisecond, "the refused one's lease taken back from the store (its TTL is 30 s)")
}

// pipeCutByClose stalls each AdmitOne until open is closed; a pipeline
// (Admit) runs its calls, then answers only when its context ends, with
// that error: the calls ran, and Close cut the reply.
type pipeCutByClose struct {
	driver.Store
	open, ran chan struct{}
	alone     atomic.Int32
	once      sync.Once
}

func (s *pipeCutByClose) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	s.alone.Add(1)
	<-s.open
	return s.Store.AdmitOne(ctx, c)
}

func (s *pipeCutByClose) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	_, _ = s.Store.Admit(context.Background(), calls)
	s.once.Do(func() { close(s.ran) })
	<-ctx.Done()
	return nil, ctx.Err()
}

// A pipeline of admission calls that Close cuts after they ran is taken
// back before Close returns, as one whose reply came is. Before, its
// callers were told the store failed, and its leases, held by nobody,
// stayed in the store for a TTL.
func TestCloseTakesBackACutPipeline(t *testing.T) {
	ms := memstore.New()
	st := &pipeCutByClose{Store: ms, open: make(chan struct{}), ran: make(chan struct{})}
	r := New[string](st, 1, WithLeaseTTL(30*time.Second), WithTimeout(5*time.Second), WithLogger(quiet()))
	var wg sync.WaitGroup
	for i, k := range []string{"a", "b", "c"} {
		wg.Go(func() {
			if s, err := r.TryAcquire(k); err == nil {
				s.Release()
			}
		})
		if k != "c" { // a and b take both places for calls alone; c waits for a pipeline
			require.Eventually(t, func() bool { return st.alone.Load() == int32(i+1) }, 5*time.Second, time.Millisecond)
		}
	}
	require.Eventually(t, func() bool { return r.queued() == 1 }, 5*time.Second, time.Millisecond)
	close(st.open)
	<-st.ran
	closeWithin(t, r)
	wg.Wait()
	n, err := ms.Count(context.Background(), "c")
	require.NoError(t, err)
	assert.Zero(t, n, "units left on c after Close")
}

// ranThenFailed runs each AdmitOne, then waits for open and fails it: the
// call ran, its reply was lost.
type ranThenFailed struct {
	driver.Store
	ran, open chan struct{}
}

func (s *ranThenFailed) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if _, err := s.Store.AdmitOne(ctx, c); err != nil {
		return driver.AdmitResult{}, err
	}
	close(s.ran)
	<-s.open
	return driver.AdmitResult{}, errInjected
}

// An admission call that ran but failed as Close began is taken back
// before the caller returns. Before, the take-back went to the releaser,
// which had stopped: the lease stayed in the store for a TTL.
func TestCloseTakesBackACallThatRan(t *testing.T) {
	ms := memstore.New()
	st := &ranThenFailed{Store: ms, ran: make(chan struct{}), open: make(chan struct{})}
	r := New[string](st, 1, WithLeaseTTL(30*time.Second), WithUnavailable(FailClosed), WithLogger(quiet()))
	done := make(chan error, 1)
	go func() {
		_, err := r.TryAcquire("k")
		done <- err
	}()
	<-st.ran
	closeWithin(t, r)
	close(st.open)
	require.Error(t, <-done)
	n, err := ms.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Zero(t, n, "units left on k after Close")
}

// withoutCounts answers admissions without their Counts, as a store that
// breaks the contract (or one of another version) may.
type withoutCounts struct{ driver.Store }

func (s withoutCounts) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	res, err := s.Store.AdmitOne(ctx, c)
	res.Counts = nil
	return res, err
}

// An admission of a learned key whose reply lacks its Counts is an error,
// and its lease is taken back. Before, TryAcquire panicked (an index out
// of range) and left the lease in the store for a TTL.
func TestLearnedAdmissionWithoutCounts(t *testing.T) {
	ms := memstore.New()
	r := New[string](withoutCounts{ms}, 4, WithLogger(quiet()))
	defer closeWithin(t, r)
	require.NoError(t, r.Learn("k", upstream.AdaptiveConfig{Max: 4}))
	var err error
	require.NotPanics(t, func() {
		var s *slots.Slot
		if s, err = r.TryAcquire("k"); err == nil {
			s.Release()
		}
	})
	assert.ErrorContains(t, err, "unexpected admission result")
	releasedInStore(t, ms, "k") // its lease taken back
}

// releasedInStore waits until the store holds no lease on key: a release
// reaches it after Release returns.
func releasedInStore(t *testing.T, ms *memstore.Store, key string) {
	t.Helper()
	require.Eventually(t, func() bool {
		n, err := ms.Count(context.Background(), key)
		return err == nil && n == 0
	}, 5*time.Second, time.Millisecond, "the release of %s in the store", key)
}

// heldWhenArmed holds the next AdmitOne after armed is set until open is
// closed (telling arrived once it is there): before it runs, or with
// decided, after the store has decided it, holding its reply. While
// failing > 0, a call fails before it runs.
type heldWhenArmed struct {
	driver.Store
	armed         atomic.Bool
	decided       bool
	arrived, open chan struct{}
	failing       atomic.Int32
}

func (s *heldWhenArmed) AdmitOne(ctx context.Context, c *driver.AdmitCall) (res driver.AdmitResult, err error) {
	if s.failing.Add(-1) >= 0 {
		return driver.AdmitResult{}, errInjected
	}
	if s.decided {
		res, err = s.Store.AdmitOne(ctx, c)
	}
	if s.armed.CompareAndSwap(true, false) {
		close(s.arrived)
		<-s.open
	}
	if s.decided {
		return res, err
	}
	return s.Store.AdmitOne(ctx, c)
}

// whileHeld runs acquire on a goroutine of its own, and once its call is
// held at st takes key outside the store (its call fails), then lets the
// held call go on. It returns the lease taken outside the store and
// acquire's error (its slot released).
func whileHeld(t *testing.T, r *Registry[string], st *heldWhenArmed, acquire func() (*slots.Slot, error), key string) (*slots.Slot, error) {
	t.Helper()
	st.armed.Store(true)
	done := make(chan error, 1)
	go func() {
		s, err := acquire()
		if err == nil {
			defer s.Release()
		}
		done <- err
	}()
	<-st.arrived
	st.failing.Store(1)
	local, err := r.TryAcquire(key)
	require.NoError(t, err)
	require.True(t, local.Degraded(), "admitted outside the store")
	close(st.open)
	return local, <-done
}

// The refusal above holds only past the limit the store admitted under: a
// local limit not refreshed yet (Keys.Limit raised from 1 to 2) does not
// refuse an admission that, with the lease held outside the store, is
// within the fleet's. (The first fix refused it; found by review.)
func TestLeaseOutsideTheStoreWithinTheLimitIsNoRefusal(t *testing.T) {
	ms := memstore.New()
	st := &heldWhenArmed{Store: ms, arrived: make(chan struct{}), open: make(chan struct{})}
	var limit atomic.Int64
	limit.Store(1)
	r := NewWithKeys[string](st, 1, Keys[string]{Limit: func(string) int { return int(limit.Load()) }},
		WithLeaseTTL(30*time.Second), WithLogger(quiet()))
	defer closeWithin(t, r)
	warm, err := r.TryAcquire("k") // the local registry has the limit 1
	require.NoError(t, err)
	warm.Release()
	releasedInStore(t, ms, "k")
	limit.Store(2)
	local, err := whileHeld(t, r, st, func() (*slots.Slot, error) { return r.TryAcquire("k") }, "k")
	defer local.Release()
	assert.NoError(t, err, "the fleet's limit is 2: one outside the store and this one")
}

// The refusal looks at every key of an admission of several: here a is
// full locally only under its local limit not refreshed yet (the fleet's
// is 2), and b, of limit 1, holds a lease admitted outside the store. (The
// second fix looked at the first full key only, a, and held the admission
// beside the lease on b: 2 of a cap of 1; found by review.)
func TestLeaseOutsideTheStoreOnAnotherKeyCounts(t *testing.T) {
	ms := memstore.New()
	st := &heldWhenArmed{Store: ms, arrived: make(chan struct{}), open: make(chan struct{})}
	var limitA atomic.Int64
	limitA.Store(1)
	r := NewWithKeys[string](st, 1, Keys[string]{Limit: func(k string) int {
		if k == "a" {
			return int(limitA.Load())
		}
		return 1
	}}, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
	defer closeWithin(t, r)
	warm, err := r.TryAcquire("a") // the local registry has a's limit 1
	require.NoError(t, err)
	warm.Release()
	releasedInStore(t, ms, "a") // else the store may count it still, and refuse on a
	limitA.Store(2)
	held, err := r.TryAcquire("a") // 1 of the fleet's 2, full under the local 1
	require.NoError(t, err)
	require.False(t, held.Degraded())
	defer held.Release()
	local, err := whileHeld(t, r, st, func() (*slots.Slot, error) { return r.TryAcquireAll("a", "b") }, "b")
	defer local.Release()
	var le *slots.LimitError
	require.ErrorAs(t, err, &le, "b's limit is 1, and this process holds one outside the store there")
	assert.Equal(t, "b", le.Key, "%v", le)
}

// renewCutByClose fails the AdmitOne calls while failing > 0; the first
// renewal that puts a lease back (ModePutBack) waits for its context to
// end (Close cuts it), then runs all the same and fails with the
// context's error: the call ran, Close cut its reply.
type renewCutByClose struct {
	driver.Store
	failing atomic.Int32
	armed   atomic.Bool
	arrived chan struct{}
}

func (s *renewCutByClose) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if s.failing.Add(-1) >= 0 {
		return driver.AdmitResult{}, errInjected
	}
	return s.Store.AdmitOne(ctx, c)
}

func (s *renewCutByClose) Renew(ctx context.Context, c *driver.RenewCall) (driver.RenewResult, error) {
	if len(c.Leases) > 0 && c.Leases[0].Mode == driver.ModePutBack && s.armed.CompareAndSwap(true, false) {
		close(s.arrived)
		<-ctx.Done()
		_, _ = s.Store.Renew(context.Background(), c)
		return driver.RenewResult{}, ctx.Err()
	}
	return s.Store.Renew(ctx, c)
}

// A lease admitted outside the store and released while the renewal that
// puts it back is on its way, a renewal that Close cuts after it ran, is
// taken out of the store before Close returns. Before, its abandon went
// to the releaser's queue once Close had stopped it, and was dropped: the
// lease, held by nobody, stayed in the store for a TTL.
func TestCloseTakesBackARenewalThatPutBackAReleasedLease(t *testing.T) {
	ms := memstore.New()
	st := &renewCutByClose{Store: ms, arrived: make(chan struct{})}
	st.failing.Store(1)
	st.armed.Store(true)
	r := New[string](st, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet())) // FallbackLocal
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	require.True(t, s.Degraded(), "admitted outside the store: its call failed")
	<-st.arrived // the heartbeat puts it back
	s.Release()  // nothing to remove yet: it is not in the store
	closeWithin(t, r)
	n, err := ms.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Zero(t, n, "units left on k after Close")
}

// An admission that the store made as its caller's context ended, and
// whose reply comes after Close, is taken back before the caller returns.
// Before, its give-back went to the releaser, which Close had stopped: the
// lease, held by nobody, stayed in the store for a TTL.
func TestCloseTakesBackAnAdmissionWhoseCallerLeft(t *testing.T) {
	ms := memstore.New()
	st := &heldWhenArmed{Store: ms, arrived: make(chan struct{}), open: make(chan struct{})}
	st.armed.Store(true)
	r := New[string](st, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		s, err := r.Acquire(ctx, "k")
		if err == nil {
			s.Release()
		}
		done <- err
	}()
	<-st.arrived
	cancel()
	closeWithin(t, r)
	// The store admits it all the same: its reply raced the cancel.
	close(st.open)
	require.Error(t, <-done) // ErrClosed
	n, err := ms.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Zero(t, n, "units left on k after Close")
}

// A Release under way as Close comes (its local Observer still running)
// removes its lease from the store before it returns. Before, its removal
// went to the releaser once Close had stopped it, and was dropped: the
// lease stayed in the store for a TTL, though Release was called before
// Close.
func TestCloseTakesBackAReleaseUnderWay(t *testing.T) {
	ms := memstore.New()
	var armed atomic.Bool
	entered, unblock := make(chan struct{}), make(chan struct{})
	obs := slots.ObserverFunc(func(e slots.Event) {
		if e.Kind == slots.EventReleased && armed.CompareAndSwap(true, false) {
			close(entered)
			<-unblock
		}
	})
	r := New[string](ms, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet()), WithLocalOptions(slots.WithObserver(obs)))
	s, err := r.TryAcquire("k")
	require.NoError(t, err)
	armed.Store(true)
	released := make(chan struct{})
	go func() {
		defer close(released)
		s.Release()
	}()
	<-entered // its lease left the held ones; its local slot is being released
	closeWithin(t, r)
	close(unblock)
	<-released
	n, err := ms.Count(context.Background(), "k")
	require.NoError(t, err)
	assert.Zero(t, n, "units left on k after Close")
}
