package fleet

import (
	"context"
	"slices"
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

// putsBackLate: once armed, each renewal waits for Close's stop (its
// context ends), then runs all the same (a call already on its way) and
// reports every lease put back: the leases released meanwhile come back
// to the renewal's requeue as plain releases, after the releaser stopped.
type putsBackLate struct {
	driver.Store
	armed    atomic.Bool
	arrived  chan struct{}
	once     atomic.Bool
	maxPairs atomic.Int32
	releases atomic.Int32
}

func (s *putsBackLate) Renew(ctx context.Context, c *driver.RenewCall) (driver.RenewResult, error) {
	if !s.armed.Load() || len(c.Leases) == 0 {
		return s.Store.Renew(ctx, c)
	}
	if s.once.CompareAndSwap(false, true) {
		close(s.arrived)
	}
	<-ctx.Done()
	res, err := s.Store.Renew(context.Background(), c)
	for i := range res.Leases {
		res.Leases[i] = driver.FatePutBack
	}
	return res, err
}

func (s *putsBackLate) Release(ctx context.Context, c *driver.ReleaseCall) error {
	s.releases.Add(1)
	for {
		m := s.maxPairs.Load()
		if int32(len(c.Pairs)) <= m || s.maxPairs.CompareAndSwap(m, int32(len(c.Pairs))) {
			break
		}
	}
	return s.Store.Release(ctx, c)
}

// Removals handed over after Close's stop (a renewal's requeue of leases
// released while it was on its way: here 300) go in release calls of at
// most batchSize pairs, as the releaser's do. Found by review: they went
// in one call of 300 pairs.
func TestRemovalsAfterTheStopKeepToBatchSize(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 300
		st := &putsBackLate{Store: memstore.New(), arrived: make(chan struct{})}
		r := New[string](st, n, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		releaseDuringARenewal(t, r, n, &st.armed, st.arrived)
		r.Close()
		t.Logf("%d Release calls, the largest of %d pairs; dropped %d", st.releases.Load(), st.maxPairs.Load(), r.Stats().RemovalsDropped)
		assert.LessOrEqual(t, int(st.maxPairs.Load()), batchSize, "a release call of at most batchSize pairs")
	})
}

// With the breaker open at Close, the removals queued before the stop,
// which the final flush cannot send, are counted dropped, as one handed
// over after the stop is, and nothing stays pending. Found by review: they
// stayed in Stats.RemovalsPending for good, never counted dropped.
func TestRemovalsGivenUpAtCloseAreCountedDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := New[string](memstore.New(), 4, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		var held []*slots.Slot
		for range 4 {
			s, err := r.TryAcquire("k")
			require.NoError(t, err)
			held = append(held, s)
		}
		r.brk.isOpen.Store(true)
		for _, s := range held[:3] {
			s.Release()
		}
		synctest.Wait()
		r.Close()
		st := r.Stats()
		t.Logf("after Close: pending %d, dropped %d", st.RemovalsPending, st.RemovalsDropped)
		assert.Zero(t, st.RemovalsPending, "nothing is pending once Close returned: the releaser is gone")
		assert.EqualValues(t, 3, st.RemovalsDropped, "the removals given up at Close are counted, as removeAfterStop counts its own")
	})
}

// The releaser takes its batches as removeLocked cuts its calls: at most
// batchSize pairs, a lease's all in one, none left behind. It took one
// lease more than that (258 pairs of leases of three keys).
func TestNextRemovalsKeepToBatchSize(t *testing.T) {
	r := New[string](memstore.New(), 4, WithLogger(quiet()))
	defer r.Close()
	var queued []*lease[string]
	for range 100 {
		queued = append(queued, &lease[string]{names: []string{"a", "b", "c"}, since: time.Now()})
	}
	r.remMu.Lock()
	r.removals = slices.Clone(queued)
	r.remMu.Unlock()
	var taken []*lease[string]
	for {
		batch := r.nextRemovals()
		if batch == nil {
			break
		}
		pairs := 0
		for _, l := range batch {
			pairs += len(l.names)
		}
		assert.LessOrEqual(t, pairs, batchSize, "a batch's pairs")
		taken = append(taken, batch...)
	}
	assert.Equal(t, queued, taken, "every removal, in order")
}
