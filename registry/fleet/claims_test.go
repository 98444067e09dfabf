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

	mu    sync.Mutex
	pipes [][]string
}

func (s *heldAlone) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
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

func (s *heldAlone) pipelines() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.pipes)
}

// grantedWaiters sets up a Registry on a heldAlone store with n places on
// key k, all held, and n waiters queued in the store behind them; then it
// arms the store and releases the places, so that each waiter is granted
// one. It returns the store, the Registry, the waiters' results, and what
// lets the held calls go (called at the test's cleanup too, before Close).
func grantedWaiters(t *testing.T, n int, timeout time.Duration) (*heldAlone, *Registry[string], <-chan result, func()) {
	ms := memstore.New()
	st := &heldAlone{Store: ms, letGo: make(chan struct{})}
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
// share pipelines, as admissions do: maxSending go at once, alone, and
// those made while they are on their way go together in one pipeline when
// the first comes back (not in a call, and a connection, each). The
// claims' lane is their own: no admission call is on its way meanwhile.
func TestClaimsSharePipelines(t *testing.T) {
	const n = 6
	st, r, waited, letGo := grantedWaiters(t, n, 5*time.Second)
	require.Eventually(t, func() bool {
		pending, claiming, _ := r.pendingClaims()
		return st.held.Load() == maxSending && claiming == maxSending && pending == n-maxSending
	}, 10*time.Second, time.Millisecond, "maxSending claims on their way, the others queued for a pipeline")
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
	assert.Len(t, pipes[0], n-maxSending)
	for _, s := range got {
		s.Release()
	}
}

// Close fails the claims queued for a pipeline at once, as it does queued
// admissions: they are never sent (the grants they would claim go back
// after the claim window), and their waiters return ErrClosed without
// waiting out the call timeout.
func TestCloseFailsQueuedClaims(t *testing.T) {
	const n = 4
	st, r, waited, letGo := grantedWaiters(t, n, time.Minute)
	require.Eventually(t, func() bool {
		pending, _, _ := r.pendingClaims()
		return st.held.Load() == maxSending && pending == n-maxSending
	}, 10*time.Second, time.Millisecond, "claims queued for a pipeline")

	closed := make(chan struct{})
	go func() {
		r.Close()
		close(closed)
	}()
	for range n - maxSending {
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
	for range maxSending { // the claims that were on their way come back
		o := <-waited
		if o.s != nil {
			o.s.Release()
		}
	}
	assert.Empty(t, st.pipelines(), "no queued claim was sent")
}
