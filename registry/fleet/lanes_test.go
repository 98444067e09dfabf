package fleet

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// heldAlone is a store that, once armed, holds every admission call sent
// alone (AdmitOne) until letGo, whatever its context says, and
// records the leases of each pipeline of admission calls (Admit) sent
// once it is armed.
type heldAlone struct {
	driver.Store
	mem   *memstore.Store // the store it wraps
	armed atomic.Bool
	held  atomic.Int32 // calls held now
	open  chan struct{}
	once  sync.Once
	// answer, if set while armed, is the status of the next call sent
	// alone, answered without the store or a hold (then it is cleared).
	answer atomic.Int32
	// noPipes: Pipelines reports false, as a store whose Admit makes one
	// call after another.
	noPipes bool

	mu    sync.Mutex
	pipes [][]string
}

func (s *heldAlone) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if s.armed.Load() {
		if st := driver.Status(s.answer.Swap(0)); st != 0 {
			r := driver.AdmitResult{Status: st, Now: time.Now().UnixMilli(), Epoch: c.Epoch}
			if st == driver.StatusTooLate {
				r.Key, r.Epoch = -1, 0
			}
			return r, nil
		}
		s.held.Add(1)
		<-s.open
		s.held.Add(-1)
	}
	return s.Store.AdmitOne(ctx, c)
}

func (s *heldAlone) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	leases := make([]string, len(calls))
	for i, c := range calls {
		leases[i] = c.Lease
	}
	if s.armed.Load() {
		s.mu.Lock()
		s.pipes = append(s.pipes, leases)
		s.mu.Unlock()
	}
	return s.Store.Admit(ctx, calls)
}

// newHeldAlone wraps a new memstore, a Pipeliner as pipes says.
func newHeldAlone(pipes bool) *heldAlone {
	m := memstore.New()
	return &heldAlone{Store: m, mem: m, open: make(chan struct{}), noPipes: !pipes}
}

// letGo lets the held calls go, and those to come; it may be called again
// (a test's cleanup does, before Close).
func (s *heldAlone) letGo() { s.once.Do(func() { close(s.open) }) }

// Pipelines makes it a driver.Pipeliner, as the Redis store is: claims
// share pipelines unless noPipes is set.
func (s *heldAlone) Pipelines() bool { return !s.noPipes }

// pipelines returns the leases of each pipeline sent once it was armed.
func (s *heldAlone) pipelines() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.pipes)
}

// grantedWaiters sets up a Registry on st with n places on key k, all
// held, and n waiters queued in the store behind them; then it arms st and
// releases the places, so that each waiter is granted one. It returns the
// Registry and the waiters' results.
func grantedWaiters(t *testing.T, st *heldAlone, n int, timeout time.Duration) (*Registry[string], <-chan result) {
	r := New[string](st, 10, WithLeaseTTL(5*time.Minute), WithTimeout(timeout), WithUnavailable(FailClosed), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	t.Cleanup(st.letGo) // before Close (cleanups run last first)
	askWhenWoken(r)     // the waiters call again only when granted
	r.SetLimit("k", n)
	<-r.subscribed // the grants are heard

	holders := make([]*slots.Slot, n)
	for i := range holders {
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		holders[i] = s
	}
	waited := make(chan result, n)
	for range n {
		go func() {
			s, err := r.Acquire(context.Background(), "k")
			waited <- result{s, err}
		}()
	}
	require.Eventually(t, func() bool { return st.mem.Queued("k") == n }, 10*time.Second, time.Millisecond, "the waiters are queued in the store")
	st.armed.Store(true)
	for _, s := range holders {
		s.Release()
	}
	return r, waited
}

// pendingClaims returns how many claims wait for a pipeline, and how many
// calls of either lane are on their way.
func (r *Registry[K]) pendingClaims() (pending, claiming, calling int) {
	r.claims.mu.Lock()
	pending, claiming = len(r.claims.pending), r.claims.sending
	r.claims.mu.Unlock()
	r.calls.mu.Lock()
	defer r.calls.mu.Unlock()
	return pending, claiming, r.calls.sending
}

// When a release grants many waiters of a process at once, their claims
// share pipelines, as admissions do: maxClaiming go at once, alone, and
// those made while they are on their way go together in one pipeline when
// the first comes back (not in a call, and a connection, each). The
// claims' lane is their own: no admission call is on its way meanwhile.
func TestClaimsSharePipelines(t *testing.T) {
	const n = maxClaiming + 4
	st := newHeldAlone(true)
	r, waited := grantedWaiters(t, st, n, 5*time.Second)
	require.Eventually(t, func() bool {
		pending, claiming, _ := r.pendingClaims()
		return st.held.Load() == maxClaiming && claiming == maxClaiming && pending == n-maxClaiming
	}, 10*time.Second, time.Millisecond, "maxClaiming claims on their way, the others queued for a pipeline")
	_, _, calling := r.pendingClaims()
	assert.Zero(t, calling, "no admission call on its way: the claims have their lane")
	assert.Empty(t, st.pipelines(), "no pipeline sent while the claims on their way are held")

	st.letGo()
	var got []*slots.Slot
	for range n {
		select {
		case o := <-waited:
			require.NoError(t, o.err)
			require.False(t, o.s.Degraded(), "admitted by the store")
			got = append(got, o.s)
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter is not admitted once the claims go")
		}
	}
	pipes := st.pipelines()
	require.Len(t, pipes, 1, "the queued claims go in one pipeline: %v", pipes)
	assert.Len(t, pipes[0], n-maxClaiming)
	for _, s := range got {
		s.Release()
	}
	require.Eventually(t, func() bool {
		pending, claiming, calling := r.pendingClaims()
		return pending == 0 && claiming == 0 && calling == 0
	}, 10*time.Second, time.Millisecond, "both lanes drained: nothing on its way or queued")
}

// On a store whose Admit makes one call after another (no
// driver.Pipeliner, or one whose Pipelines reports false), each claim goes
// at once, alone: a burst of them would wait for each other in a
// pipeline.
func TestClaimsGoAloneWithoutPipelines(t *testing.T) {
	const n = maxClaiming + 2
	st := newHeldAlone(false)
	r, waited := grantedWaiters(t, st, n, 5*time.Second)
	require.Eventually(t, func() bool { return st.held.Load() == n }, 10*time.Second, time.Millisecond,
		"every claim on its way at once, alone")
	pending, claiming, _ := r.pendingClaims()
	assert.Zero(t, pending, "none queued")
	assert.Equal(t, n, claiming)
	st.letGo()
	for range n {
		o := nextResult(t, waited)
		require.NoError(t, o.err)
		o.s.Release()
	}
	assert.Empty(t, st.pipelines(), "no claim in a pipeline")
}

// A waiter's ordered call (its first under a ticket, or under a new
// epoch) stays in the admissions' lane even when it claims a grant: the
// order of the process's waiters is kept there.
func TestOrderedClaimStaysInAdmissionsLane(t *testing.T) {
	st := newHeldAlone(true)
	r := New[string](st, 10, WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	t.Cleanup(st.letGo)
	st.armed.Store(true)
	placed := make(chan struct{}, 1)
	done := make(chan reply, 1)
	ac := &driver.AdmitCall{Lease: newLeaseID(), Keys: []string{"k"}, Limits: []int{1}, TTL: time.Minute, Claim: time.Second,
		Live: 5 * time.Second, Weight: 1, MaxQueue: -1, MaxFlowQueue: -1, Proc: "p"}
	go func() { done <- r.call(context.Background(), ac, 0, func() { placed <- struct{}{} }, true) }()
	<-placed
	require.Eventually(t, func() bool { return st.held.Load() == 1 }, 10*time.Second, time.Millisecond)
	_, claiming, calling := r.pendingClaims()
	assert.Equal(t, 1, calling, "on its way in the admissions' lane")
	assert.Zero(t, claiming, "not in the claims' lane")
	st.letGo()
	rp := <-done
	require.NoError(t, rp.err)
	require.NoError(t, st.Store.Release(context.Background(), &driver.ReleaseCall{Claim: time.Second,
		Pairs: []driver.Release{{Key: "k", Lease: ac.Lease, Limit: 1}}}))
}

// Close fails the claims queued for a pipeline at once, as it does queued
// admissions: they are never sent (their waiters give the grants back as
// they leave), and their waiters return ErrClosed without waiting out the
// call timeout.
func TestCloseFailsQueuedClaims(t *testing.T) {
	const n = maxClaiming + 2
	st := newHeldAlone(true)
	r, waited := grantedWaiters(t, st, n, time.Minute)
	require.Eventually(t, func() bool {
		pending, _, _ := r.pendingClaims()
		return st.held.Load() == maxClaiming && pending == n-maxClaiming
	}, 10*time.Second, time.Millisecond, "claims queued for a pipeline")

	closed := make(chan struct{})
	go func() {
		r.Close()
		close(closed)
	}()
	for range n - maxClaiming {
		select {
		case o := <-waited:
			assert.True(t, errors.Is(o.err, ErrClosed), "a queued claim's waiter: %v", o.err)
			assert.Nil(t, o.s)
		case <-time.After(10 * time.Second):
			t.Fatal("a queued claim's waiter still waits after Close")
		}
	}
	st.letGo()
	<-closed
	for range maxClaiming { // the claims that were on their way come back
		if o := nextResult(t, waited); o.s != nil {
			o.s.Release()
		}
	}
	assert.Empty(t, st.pipelines(), "no queued claim was sent")
}

// A claim refused as too late is made again at once under its ticket, in
// the claims' lane; a claim answered that the grant is gone (queued again:
// given back, or its window ran out) leaves the ticket's next call to the
// admissions' lane.
func TestClaimLaneAfterAnAnswer(t *testing.T) {
	for _, tc := range []struct {
		answer            driver.Status
		lane              string
		claiming, calling int // on their way after the answer
	}{
		{driver.StatusTooLate, "claims", 1, 0},
		{driver.StatusQueued, "admissions", 0, 1},
	} {
		t.Run(tc.lane, func(t *testing.T) {
			st := newHeldAlone(true)
			st.answer.Store(int32(tc.answer)) // the grant's claim, once armed
			r, waited := grantedWaiters(t, st, 1, 5*time.Second)
			if tc.answer == driver.StatusQueued {
				require.Eventually(t, func() bool { return st.answer.Load() == 0 }, 10*time.Second, time.Millisecond, "the claim answered")
				r.wakeAll() // the waiter asks again now
			}
			require.Eventually(t, func() bool { return st.held.Load() == 1 }, 10*time.Second, time.Millisecond, "the next call on its way")
			_, claiming, calling := r.pendingClaims()
			assert.Equal(t, []int{tc.claiming, tc.calling}, []int{claiming, calling}, "claims, admissions on their way")
			st.letGo()
			o := nextResult(t, waited)
			require.NoError(t, o.err)
			o.s.Release()
		})
	}
}

// nextResult returns a waiter's result, failing the test if none comes in 10 s.
func nextResult(t *testing.T, waited <-chan result) result {
	t.Helper()
	select {
	case o := <-waited:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter does not return")
		return result{}
	}
}
