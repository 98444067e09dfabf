package fleet

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// admission is an admission call a test store saw, with how it went.
type admission struct {
	lease  string
	keys   []string
	wait   bool
	alone  bool // sent with AdmitOne, not in a pipeline (Admit)
	status driver.Status
}

// stuckCalls is a store that holds every admission call on the key stuck
// (sent alone, or a pipeline with one such call) until letGo is closed,
// whatever its context says: the calls stay on their way. It records the
// other admission calls, as they return.
type stuckCalls struct {
	driver.Store
	stuck string
	letGo chan struct{}
	held  atomic.Int32 // calls held now

	mu   sync.Mutex
	seen []admission
}

func (s *stuckCalls) hold(calls []*driver.AdmitCall) bool {
	for _, c := range calls {
		if slices.Contains(c.Keys, s.stuck) {
			s.held.Add(1)
			<-s.letGo
			s.held.Add(-1)
			return true
		}
	}
	return false
}

func (s *stuckCalls) record(alone bool, calls []*driver.AdmitCall, res []driver.AdmitResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range calls {
		s.seen = append(s.seen, admission{lease: c.Lease, keys: slices.Clone(c.Keys), wait: c.Wait, alone: alone, status: res[i].Status})
	}
}

func (s *stuckCalls) admissions() []admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seen)
}

func (s *stuckCalls) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	calls := []*driver.AdmitCall{c}
	stuck := s.hold(calls)
	res, err := s.Store.AdmitOne(ctx, c)
	if !stuck && err == nil {
		s.record(true, calls, []driver.AdmitResult{res})
	}
	return res, err
}

func (s *stuckCalls) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	stuck := s.hold(calls)
	res, err := s.Store.Admit(ctx, calls)
	if !stuck && err == nil && len(res) == len(calls) {
		s.record(false, calls, res)
	}
	return res, err
}

// askWhenWoken makes r's waiters queued in the store ask again only when
// woken (or 30 s on): a claim window of a minute, and the liveness of r's
// process made anew for it (a process within 1.5 claim windows of its
// liveness deadline counts as dead), which r's lease TTL bounds: make it
// 5 min.
func askWhenWoken(r *Registry[string]) {
	r.claim = time.Minute
	r.live = min(r.cfg.ttl, 5*r.claim)
}

// A waiter woken by its grant claims it at once, in the claims' lane: not
// queued for a pipeline behind maxSending admission calls that are on their
// way (here stuck in the store), which would keep the place its grant holds
// unused until they come back, or fail the claim after the call timeout.
func TestClaimDoesNotWaitForPipelines(t *testing.T) {
	ms := memstore.New()
	st := &stuckCalls{Store: ms, stuck: "other", letGo: make(chan struct{})}
	r := New[string](st, 10, WithLeaseTTL(5*time.Minute), WithTimeout(5*time.Second), WithUnavailable(FailClosed), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	var once sync.Once
	letGo := func() { once.Do(func() { close(st.letGo) }) }
	t.Cleanup(letGo) // before Close (cleanups run last first)
	askWhenWoken(r)
	r.SetLimit("k", 1)
	<-r.subscribed // the grant is heard

	holder, err := r.TryAcquire("k")
	require.NoError(t, err)
	waited := make(chan result, 1)
	go func() {
		s, err := r.Acquire(context.Background(), "k")
		waited <- result{s, err}
	}()
	require.Eventually(t, func() bool { return ms.Queued("k") == 1 }, 10*time.Second, time.Millisecond, "the waiter is queued in the store")

	// maxSending calls on their way, stuck.
	others := make(chan result, maxSending)
	for range maxSending {
		go func() {
			s, err := r.TryAcquire("other")
			others <- result{s, err}
		}()
	}
	require.Eventually(t, func() bool { return st.held.Load() == maxSending }, 10*time.Second, time.Millisecond, "the calls on other are stuck")
	r.calls.mu.Lock()
	sending := r.calls.sending
	r.calls.mu.Unlock()
	require.Equal(t, maxSending, sending, "as many calls on their way as may be")

	holder.Release() // the store grants the waiter
	var got result
	select {
	case got = <-waited:
	case <-time.After(10 * time.Second): // a bound on a claim held back
		t.Fatal("the waiter's claim waits behind the calls on their way")
	}
	require.NoError(t, got.err)
	require.NotNil(t, got.s)
	assert.False(t, got.s.Degraded(), "admitted by the store")
	assert.Equal(t, int32(maxSending), st.held.Load(), "the calls on other are still stuck")

	// The waiter's calls: one that queued it, its asks again under the same
	// ticket (one each claim window, a second at most, in case a wake-up
	// was lost: on a slow machine one may come before the grant, as in CI
	// at 4331b87), then the claim, alone.
	var mine []admission
	for _, a := range st.admissions() {
		if slices.Equal(a.keys, []string{"k"}) && a.wait {
			mine = append(mine, a)
		}
	}
	require.GreaterOrEqual(t, len(mine), 2, "the waiter's calls: %+v", mine)
	claim := mine[len(mine)-1]
	for _, a := range mine[:len(mine)-1] {
		assert.Equal(t, driver.StatusQueued, a.status, "the waiter's calls: %+v", mine)
		assert.Equal(t, mine[0].lease, a.lease, "one ticket")
	}
	assert.Equal(t, driver.StatusAdmitted, claim.status, "the claim")
	assert.Equal(t, mine[0].lease, claim.lease, "the claim is the queued ticket's")
	assert.True(t, claim.alone, "the claim goes alone (AdmitOne), not in a pipeline")

	letGo()
	for range maxSending {
		select {
		case o := <-others:
			if o.s != nil {
				o.s.Release()
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call let go does not return")
		}
	}
	got.s.Release()
}

// removal is a Release or an Abandon call a test store saw: the leases it
// removes.
type removal struct {
	abandon bool
	leases  []string
}

// removalOrder is a store that records the Release and Abandon calls in
// the order they come, and the admission calls; armed, it holds the next
// Release until letGo is closed (whatever its context says), having closed
// held.
type removalOrder struct {
	driver.Store
	armed atomic.Bool
	held  chan struct{}
	letGo chan struct{}

	mu       sync.Mutex
	removals []removal
	admits   []admission
}

func (s *removalOrder) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	s.mu.Lock()
	s.admits = append(s.admits, admission{lease: c.Lease, keys: slices.Clone(c.Keys), wait: c.Wait, alone: true})
	s.mu.Unlock()
	return s.Store.AdmitOne(ctx, c)
}

func (s *removalOrder) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	s.mu.Lock()
	for _, c := range calls {
		s.admits = append(s.admits, admission{lease: c.Lease, keys: slices.Clone(c.Keys), wait: c.Wait})
	}
	s.mu.Unlock()
	return s.Store.Admit(ctx, calls)
}

func (s *removalOrder) Release(ctx context.Context, c *driver.ReleaseCall) error {
	x := removal{}
	for _, p := range c.Pairs {
		x.leases = append(x.leases, p.Lease)
	}
	s.mu.Lock()
	s.removals = append(s.removals, x)
	s.mu.Unlock()
	if s.armed.CompareAndSwap(true, false) {
		close(s.held)
		<-s.letGo
	}
	return s.Store.Release(ctx, c)
}

func (s *removalOrder) Abandon(ctx context.Context, calls []*driver.AbandonCall) ([]error, error) {
	x := removal{abandon: true}
	for _, c := range calls {
		x.leases = append(x.leases, c.Lease)
	}
	s.mu.Lock()
	s.removals = append(s.removals, x)
	s.mu.Unlock()
	return s.Store.Abandon(ctx, calls)
}

func (s *removalOrder) seen() ([]removal, []admission) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.removals), slices.Clone(s.admits)
}

// leaseOn returns the lease of the one admission call in admits on keys
// that waits or not.
func leaseOn(t *testing.T, admits []admission, keys []string, wait bool) string {
	t.Helper()
	var leases []string
	for _, a := range admits {
		if slices.Equal(a.keys, keys) && a.wait == wait && !slices.Contains(leases, a.lease) {
			leases = append(leases, a.lease)
		}
	}
	require.Len(t, leases, 1, "the lease of the call on %v (wait %v)", keys, wait)
	return leases[0]
}

// In one batch of removals, the releaser sends the plain releases (one
// Release call) before the abandons (an Abandon call): the releases free
// places, which the store hands to the waiters at once. Here a release is
// held in the store while a waiter gives up (its place is abandoned) and
// another slot is released: both go in the next batch, the Release first.
func TestReleasesGoBeforeAbandons(t *testing.T) {
	ms := memstore.New()
	st := &removalOrder{Store: ms, held: make(chan struct{}), letGo: make(chan struct{})}
	r := New[string](st, 1, WithLeaseTTL(5*time.Minute), WithTimeout(5*time.Second), WithLogger(quiet()))
	t.Cleanup(func() { closeWithin(t, r) })
	var once sync.Once
	letGo := func() { once.Do(func() { close(st.letGo) }) }
	t.Cleanup(letGo) // before Close (cleanups run last first)
	askWhenWoken(r)

	first, err := r.TryAcquire("a")
	require.NoError(t, err)
	second, err := r.TryAcquire("b")
	require.NoError(t, err)
	holder, err := r.TryAcquire("k")
	require.NoError(t, err)
	t.Cleanup(func() { holder.Release() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		s, err := r.Acquire(ctx, "k")
		if s != nil {
			s.Release()
		}
		waited <- err
	}()
	require.Eventually(t, func() bool { return ms.Queued("k") == 1 }, 10*time.Second, time.Millisecond, "the waiter is queued in the store")

	// The first release reaches the store and is held there.
	st.armed.Store(true)
	first.Release()
	select {
	case <-st.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the first release does not reach the store")
	}
	// Meanwhile the waiter gives up (its place is to be abandoned), and
	// the second slot is released: both wait for the next batch.
	cancel()
	select {
	case err := <-waited:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter does not give up")
	}
	second.Release()
	require.Equal(t, 2, r.Stats().RemovalsPending, "the abandon and the release wait for the same batch")

	letGo()
	require.Eventually(t, func() bool {
		removals, _ := st.seen()
		return len(removals) >= 3
	}, 10*time.Second, time.Millisecond, "the next batch is sent")
	removals, admits := st.seen()
	want := []removal{
		{leases: []string{leaseOn(t, admits, []string{"a"}, false)}},               // the held one
		{leases: []string{leaseOn(t, admits, []string{"b"}, false)}},               // the second release...
		{abandon: true, leases: []string{leaseOn(t, admits, []string{"k"}, true)}}, // ...before the waiter's abandon
	}
	assert.Equal(t, want, removals)
	assert.Equal(t, 0, ms.Queued("k"), "the waiter left the queue")
}
