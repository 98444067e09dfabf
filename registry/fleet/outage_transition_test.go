package fleet

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// Waiters queued in the fleet's queue when the store stops answering go on
// in this process's order under the local registry: the room a release
// frees then goes to the first of them, as in the store (and in a local
// registry), not to whichever runs first.
func TestOutageKeepsTheOrderOfWaitersQueuedInTheStore(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(5*time.Second, 5*time.Second))
		defer r.Close()
		held, err := r.TryAcquire("k")
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		order := make(chan int, 3)
		for i := range 3 {
			go func() {
				s, err := r.Acquire(ctx, "k")
				if err == nil {
					order <- i
					<-ctx.Done()
					s.Release()
				}
			}()
			synctest.Wait()
			require.Equal(t, i+1, ms.Queued("k"))
		}
		ms.Kill()
		held.Release()
		synctest.Wait()
		require.True(t, r.Stats().BreakerOpen)
		select {
		case i := <-order:
			assert.Equal(t, 0, i, "the first waiter takes the room")
		default:
			t.Errorf("no waiter took the room")
		}
		cancel()
		synctest.Wait()
	})
}

// A waiter held back by an earlier one that is still being decided under
// the local registry (not told yet that the key is full) takes its place
// in this process's order, against the local queue bounds, once the
// earlier one is told: before a waiter that comes after it. Before, it
// lined up only when it next woke (its poll's backoff later): a waiter
// that came after it took the last place meanwhile, and it was refused
// with ErrQueueFull while the later one waited. A local registry refuses
// the later one.
func TestOutageQueueBoundsKeepArrivalOrder(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		obs, armed, in, out := stopAt(slots.EventRejected)
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Hour), WithPoll(5*time.Second, 5*time.Second),
			WithLocalOptions(slots.WithMaxQueue(2), slots.WithObserver(obs)))
		defer r.Close()
		local := registry.New[string](1, slots.WithMaxQueue(2))
		ms.Kill()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for _, o := range []struct {
			name    string
			acquire func(ctx context.Context, key string) (*slots.Slot, error)
			try     func(key string) (*slots.Slot, error)
		}{{"fleet", r.Acquire, r.TryAcquire}, {"local", local.Acquire, local.TryAcquire}} {
			held, err := o.try("k")
			require.NoError(t, err, o.name)
			errs := make([]chan error, 3)
			wait := func(i int) {
				errs[i] = make(chan error, 1)
				go func() {
					s, err := o.acquire(ctx, "k")
					if err == nil {
						s.Release()
					}
					errs[i] <- err
				}()
			}
			armed.Store(o.name == "fleet")
			wait(0)
			if o.name == "fleet" {
				<-in // the first is being decided under the local registry
			}
			wait(1)
			synctest.Wait()
			close(out)
			synctest.Wait()
			wait(2)
			synctest.Wait()
			select {
			case err := <-errs[2]:
				assert.ErrorIs(t, err, slots.ErrQueueFull, "%s: the third is over the bound", o.name)
			default:
				t.Errorf("%s: the third waits past the bound", o.name)
			}
			time.Sleep(time.Minute)
			for i := range 2 {
				select {
				case err := <-errs[i]:
					t.Errorf("%s: waiter %d failed: %v", o.name, i, err)
				default:
				}
			}
			held.Release()
			for i := range 2 {
				select {
				case err := <-errs[i]:
					assert.NoError(t, err, "%s: waiter %d", o.name, i)
				case <-time.After(time.Minute):
					t.Errorf("%s: waiter %d not admitted", o.name, i)
				}
			}
			out = make(chan struct{})
		}
	})
}
