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

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// keyFailing fails (errStoreDown) the admission calls whose keys are
// exactly failKeys (and, if spare is set, whose lease is not spare's)
// while failing is set; the others go to the store.
type keyFailing struct {
	*memstore.Store
	failing  atomic.Bool
	failKeys []string
	spare    atomic.Value // string
}

func (s *keyFailing) fails(c *driver.AdmitCall) bool {
	if sp, _ := s.spare.Load().(string); sp != "" && c.Lease == sp {
		return false
	}
	return s.failing.Load() && slices.Equal(c.Keys, s.failKeys)
}

func (s *keyFailing) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if s.fails(c) {
		return driver.AdmitResult{Err: errStoreDown}, errStoreDown
	}
	return s.Store.AdmitOne(ctx, c)
}

func (s *keyFailing) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	out := make([]driver.AdmitResult, len(calls))
	for i, c := range calls {
		if s.fails(c) {
			out[i] = driver.AdmitResult{Err: errStoreDown}
			continue
		}
		res, err := s.Store.Admit(ctx, []*driver.AdmitCall{c})
		if err != nil {
			return nil, err
		}
		out[i] = res[0]
	}
	return out, nil
}

// A waiter of several keys (AcquireAll "a", "b") queued in the fleet's
// queue because "b" is full (another process holds it) cannot take the
// room of "a": the store admits a newcomer on "a" beside it (a newcomer
// passes no waiter that could take the room, PROTOCOL.md "Waiting"). So
// a newcomer on "a" whose own call fails, the breaker closed, is admitted
// (Degraded), as the store would have admitted it: the waiter is left the
// room only of the key the store told it full. (Counted on every key, it
// had the newcomers refused for as long as "b" stayed full, each refusal
// waking it to be queued again, and the room of "a" stood idle.)
func TestNewcomerNotRefusedForAWaiterOfSeveralKeysHeldBackElsewhere(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		st := &keyFailing{Store: memstore.New(), failKeys: []string{"a"}}
		r := New[string](st, 1, WithLogger(quiet()), WithBreaker(5, time.Hour), WithPoll(time.Hour, time.Hour))
		defer r.Close()
		other := New[string](st.Store, 1, WithLogger(quiet())) // another process, which holds "b"
		defer other.Close()
		b, err := other.TryAcquire("b")
		require.NoError(t, err)
		defer b.Release()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := acquireIn(func() (*slots.Slot, error) { return r.AcquireAll(ctx, "a", "b") })
		synctest.Wait()
		require.Equal(t, 1, st.Queued("b"), "the waiter is queued in the fleet's queue")

		// The store's rule: a newcomer on "a" is admitted beside the waiter.
		s, err := r.TryAcquire("a")
		require.NoError(t, err, "the store admits a newcomer on a: the waiter cannot take it")
		require.False(t, s.Degraded())
		s.Release()
		synctest.Wait()

		st.failing.Store(true)
		refused := 0
		for range 4 {
			s, err := r.TryAcquire("a") // its call fails: decided under the local registry
			require.False(t, r.Stats().BreakerOpen)
			if err != nil {
				refused++
			} else {
				s.Release()
			}
			synctest.Wait()
			time.Sleep(time.Minute)
		}
		assert.Zero(t, refused, "newcomers on a refused for a waiter the store would have let them pass (room on a idle %v)", 4*time.Minute)
		select {
		case w := <-got:
			t.Errorf("the waiter was admitted: %v", w)
			if w != nil {
				w.Release()
			}
		default:
		}
		st.failing.Store(false)
		cancel()
		<-got
	})
}
