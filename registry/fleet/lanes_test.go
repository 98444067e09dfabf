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
// alone (AdmitOne) until letGo is closed, whatever its context says, and
// records the leases of each pipeline of admission calls (Admit) sent
// once it is armed.
type heldAlone struct {
	driver.Store
	armed atomic.Bool
	held  atomic.Int32 // calls held now
	letGo chan struct{}
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
	if st := driver.Status(s.answer.Swap(0)); st != 0 && s.armed.Load() {
		r := driver.AdmitResult{Status: st, Now: time.Now().UnixMilli(), Epoch: c.Epoch}
		if st == driver.StatusTooLate {
			r.Key, r.Epoch = -1, 0
		}
		return r, nil
	}
	if s.armed.Load() {
		s.held.Add(1)
		<-s.letGo
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

// Pipelines makes it a driver.Pipeliner, as the Redis store is: claims
// share pipelines unless noPipes is set.
func (s *heldAlone) Pipelines() bool { return !s.noPipes }

// pipelines returns the leases of each pipeline sent once it was armed.
func (s *heldAlone) pipelines() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.pipes)
}

// grantedWaiters sets up a Registry on a heldAlone store (a Pipeliner as
// pipes says) with n places on key k, all held, and n waiters queued in
// the store behind them; then it arms the store and releases the places,
// so that each waiter is granted one. It returns the store, the Registry,
// the waiters' results, and what lets the held calls go (called at the
// test's cleanup too, before Close).
func grantedWaiters(t *testing.T, n int, timeout time.Duration, pipes bool) (*heldAlone, *Registry[string], <-chan result, func()) {
	ms := memstore.New()
	st := &heldAlone{Store: ms, letGo: make(chan struct{}), noPipes: !pipes}
	r := New[string](st, 10, WithLeaseTTL(5*time.Minute), WithTimeout(timeout), WithUnavailable(FailClosed), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	var once sync.Once
	letGo := func() { once.Do(func() { close(st.letGo) }) }
	t.Cleanup(letGo) // before Close (cleanups run last first)
	askWhenWoken(r)  // the waiters call again only when granted
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
	require.Eventually(t, func() bool { return ms.Queued("k") == n }, 10*time.Second, time.Millisecond, "the waiters are queued in the store")
	st.armed.Store(true)
	for _, s := range holders {
		s.Release()
	}
	return st, r, waited, letGo
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
	st, r, waited, letGo := grantedWaiters(t, n, 5*time.Second, true)
	require.Eventually(t, func() bool {
		pending, claiming, _ := r.pendingClaims()
		return st.held.Load() == maxClaiming && claiming == maxClaiming && pending == n-maxClaiming
	}, 10*time.Second, time.Millisecond, "maxClaiming claims on their way, the others queued for a pipeline")
	_, _, calling := r.pendingClaims()
	assert.Zero(t, calling, "no admission call on its way: the claims have their lane")
	assert.Empty(t, st.pipelines(), "no pipeline sent while the claims on their way are held")

	letGo()
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
	st, r, waited, letGo := grantedWaiters(t, n, 5*time.Second, false)
	require.Eventually(t, func() bool { return st.held.Load() == n }, 10*time.Second, time.Millisecond,
		"every claim on its way at once, alone")
	pending, claiming, _ := r.pendingClaims()
	assert.Zero(t, pending, "none queued")
	assert.Equal(t, n, claiming)
	letGo()
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
	st := &heldAlone{Store: memstore.New(), letGo: make(chan struct{})}
	r := New[string](st, 10, WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	var once sync.Once
	letGo := func() { once.Do(func() { close(st.letGo) }) }
	t.Cleanup(letGo)
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
	letGo()
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
	st, r, waited, letGo := grantedWaiters(t, n, time.Minute, true)
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
	letGo()
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
		answer driver.Status
		lane   string
	}{
		{driver.StatusTooLate, "claims"},
		{driver.StatusQueued, "admissions"},
	} {
		t.Run(tc.lane, func(t *testing.T) {
			ms := memstore.New()
			st := &heldAlone{Store: ms, letGo: make(chan struct{})}
			r := New[string](st, 10, WithLeaseTTL(5*time.Minute), WithTimeout(5*time.Second), WithLogger(quiet()))
			t.Cleanup(func() { closeWithin(t, r) })
			var once sync.Once
			letGo := func() { once.Do(func() { close(st.letGo) }) }
			t.Cleanup(letGo)
			askWhenWoken(r)
			r.SetLimit("k", 1)
			<-r.subscribed
			holder, err := r.TryAcquire("k")
			require.NoError(t, err)
			waited := make(chan result, 1)
			go func() {
				s, err := r.Acquire(context.Background(), "k")
				waited <- result{s, err}
			}()
			require.Eventually(t, func() bool { return ms.Queued("k") == 1 }, 10*time.Second, time.Millisecond)
			st.answer.Store(int32(tc.answer))
			st.armed.Store(true)
			holder.Release() // the grant, and its claim, answered tc.answer
			if tc.answer == driver.StatusQueued {
				require.Eventually(t, func() bool { return st.answer.Load() == 0 }, 10*time.Second, time.Millisecond, "the claim answered")
				r.wakeAll() // the waiter asks again now
			}
			require.Eventually(t, func() bool { return st.held.Load() == 1 }, 10*time.Second, time.Millisecond, "the next call on its way")
			_, claiming, calling := r.pendingClaims()
			if tc.lane == "claims" {
				assert.Equal(t, []int{1, 0}, []int{claiming, calling}, "claims, admissions on their way")
			} else {
				assert.Equal(t, []int{0, 1}, []int{claiming, calling}, "claims, admissions on their way")
			}
			letGo()
			select {
			case o := <-waited:
				require.NoError(t, o.err)
				o.s.Release()
			case <-time.After(10 * time.Second):
				t.Fatal("the waiter is not admitted")
			}
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
