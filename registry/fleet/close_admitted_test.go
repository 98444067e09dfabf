package fleet

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/memstore"
)

// A waiter granted its turn in the fleet's queue as Close comes (the store
// hanging from then on) gives its lease back (hold, giveBack): one abandon
// of its id, within a call timeout, one removal dropped if it cannot be
// sent. Before its fix, admit then took its place in the queue back too
// (leaveQueue: the waiter was still queued as that id), a second abandon
// of the same id after the first, which doubled its wait (two call
// timeouts) and counted the one lease twice in RemovalsDropped.
func TestAWaiterAdmittedAsCloseComesGivesItsLeaseBackOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms := memstore.New()
		st := &hangsAtClose{Store: ms, arrived: make(chan struct{})}
		r := New[string](st, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet()))
		held, err := r.TryAcquire("k")
		require.NoError(t, err)
		closed := make(chan struct{})
		var once sync.Once
		var closing time.Time
		r.holdHook = func() {
			once.Do(func() {
				st.hang.Store(true)
				closing = time.Now()
				go func() { r.Close(); close(closed) }()
				for {
					r.mu.Lock()
					c := r.closed
					r.mu.Unlock()
					if c {
						return
					}
					time.Sleep(time.Microsecond)
				}
			})
		}
		errc := make(chan error, 1)
		go func() {
			s, err := r.Acquire(context.Background(), "k")
			if err == nil {
				s.Release()
			}
			errc <- err
		}()
		synctest.Wait()
		require.Equal(t, 1, ms.Queued("k"), "queued in the store")
		dropped, abandons := r.Stats().RemovalsDropped, st.abandons.Load()
		held.Release() // its grant: the waiter claims it, and Close comes
		require.ErrorIs(t, <-errc, ErrClosed)
		left := time.Since(closing)
		<-closed
		assert.Equal(t, int32(1), st.abandons.Load()-abandons, "one abandon of its id")
		assert.Equal(t, uint64(1), r.Stats().RemovalsDropped-dropped, "one lease dropped")
		assert.LessOrEqual(t, left, 501*time.Millisecond, "within a call timeout")
	})
}
