package fleet

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// hangsAtClose: once armed, the first renewal waits for its context to end
// (Close cuts it); once hang is set, every removal (Release, Abandon)
// waits for its context to end: a store that stopped answering.
type hangsAtClose struct {
	driver.Store
	armed    atomic.Bool
	hang     atomic.Bool
	arrived  chan struct{}
	abandons atomic.Int32
	releases atomic.Int32
}

func (s *hangsAtClose) Renew(ctx context.Context, c *driver.RenewCall) (driver.RenewResult, error) {
	if s.armed.CompareAndSwap(true, false) {
		close(s.arrived)
		<-ctx.Done()
		return driver.RenewResult{}, ctx.Err()
	}
	return s.Store.Renew(ctx, c)
}

func (s *hangsAtClose) Release(ctx context.Context, c *driver.ReleaseCall) error {
	s.releases.Add(1)
	if s.hang.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	return s.Store.Release(ctx, c)
}

func (s *hangsAtClose) Abandon(ctx context.Context, c []*driver.AbandonCall) ([]error, error) {
	s.abandons.Add(1)
	if s.hang.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Abandon(ctx, c)
}

// A renewal that Close cuts requeues an abandon per lease released while
// it was on its way (ReassertLost, the default, puts leases back), after
// the releaser has stopped: they are sent together, within one call
// timeout in all, and Close, which waits for the renewal, is bounded so
// even when the store hangs. Found by review: each was sent in a call of
// its own, one after the other, a call timeout per released lease (10.5 s
// for 20 leases).
func TestCloseBoundedAfterACutRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 20
		st := &hangsAtClose{Store: memstore.New(), arrived: make(chan struct{})}
		r := New[string](st, n, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		releaseDuringARenewal(t, r, n, &st.armed, st.arrived)
		st.hang.Store(true)
		start := time.Now()
		r.Close()
		took := time.Since(start)
		t.Logf("Close took %v; %d Abandon calls, %d Release calls", took, st.abandons.Load(), st.releases.Load())
		assert.LessOrEqual(t, took, 3*500*time.Millisecond, "Close is bounded by about a call timeout (or two), not one per lease")
	})
}

func (s *hangsAtClose) Ping(ctx context.Context) error {
	if s.hang.Load() {
		return errInjected
	}
	return s.Store.Ping(ctx)
}

// Releases under way as Close comes (their local Observer still running),
// the store unreachable and the breaker open: their removals, after the
// releaser has stopped, are dropped as its flush drops what it cannot send
// while the breaker is open, and no Release waits. Found by review: each
// made a store call that ignored the breaker, one at a time, so the k-th
// Release waited k call timeouts.
func TestReleaseAfterCloseWithTheBreakerOpenIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const k = 8
		st := &hangsAtClose{Store: memstore.New(), arrived: make(chan struct{})}
		var armed atomic.Bool
		var entered atomic.Int32
		unblock := make(chan struct{})
		obs := slots.ObserverFunc(func(e slots.Event) {
			if e.Kind == slots.EventReleased && armed.Load() {
				entered.Add(1)
				<-unblock
			}
		})
		r := New[string](st, k, WithLeaseTTL(30*time.Second), WithLogger(quiet()), WithLocalOptions(slots.WithObserver(obs)))
		var held []*slots.Slot
		for range k {
			s, err := r.TryAcquire("k")
			require.NoError(t, err)
			held = append(held, s)
		}
		st.hang.Store(true)
		r.brk.isOpen.Store(true) // the store unreachable: the breaker is open
		armed.Store(true)
		took := make(chan time.Duration, k)
		for _, s := range held {
			go func() {
				start := time.Now()
				s.Release()
				took <- time.Since(start)
			}()
		}
		synctest.Wait()
		require.EqualValues(t, k, entered.Load())
		r.Close()
		close(unblock)
		var longest time.Duration
		for range k {
			longest = max(longest, <-took)
		}
		t.Logf("longest Release: %v; %d Release calls to the store", longest, st.releases.Load())
		assert.LessOrEqual(t, longest, 500*time.Millisecond, "a Release waits at most a call timeout, and none with the breaker open")
	})
}

// releaseDuringARenewal takes n slots of "k" on r, arms its store's next
// renewal (armed), waits until that renewal is on its way (arrived; it
// holds storeMu), and releases every slot: their removals wait for it.
func releaseDuringARenewal(t *testing.T, r *Registry[string], n int, armed *atomic.Bool, arrived <-chan struct{}) {
	t.Helper()
	var held []*slots.Slot
	for range n {
		s, err := r.TryAcquire("k")
		require.NoError(t, err)
		held = append(held, s)
	}
	armed.Store(true)
	<-arrived
	for _, s := range held {
		s.Release()
	}
}
