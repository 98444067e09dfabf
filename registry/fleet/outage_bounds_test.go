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

// While the store cannot be reached (FallbackLocal), the local caps are
// the caps, and slots.WithMaxQueue and WithMaxQueuePerFlow among the local
// options still bound this process's waits, as they bound a local
// registry's for the same sequence: a caller over a bound fails at once
// with ErrQueueFull, instead of waiting (polling) for as long as its
// context lets it.
func TestOutageQueueBounds(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		opts := []registry.Option{slots.WithMaxQueue(2), slots.WithMaxQueuePerFlow(1)}
		ms := memstore.New()
		r := New[string](ms, 1, WithLogger(quiet()), WithBreaker(1, time.Hour), WithUnavailable(FallbackLocal),
			WithLocalOptions(opts...))
		defer r.Close()
		local := registry.New[string](1, opts...)
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
			wait := func(flow string) {
				go func() {
					if s, err := o.acquire(slots.WithFlow(ctx, flow), "k"); err == nil {
						s.Release()
					}
				}()
				synctest.Wait()
			}
			over := func(flow, what string) {
				t.Helper()
				wctx, wcancel := context.WithTimeout(ctx, time.Minute)
				defer wcancel()
				start := time.Now()
				_, err := o.acquire(slots.WithFlow(wctx, flow), "k")
				assert.ErrorIs(t, err, slots.ErrQueueFull, "%s: %s", o.name, what)
				assert.Less(t, time.Since(start), time.Second, "%s: %s: refused at once", o.name, what)
			}
			wait("x")
			over("x", "flow x has 1 waiting")
			wait("y")
			over("z", "the queue has 2")
			held.Release()
			synctest.Wait()
		}
		cancel()
		synctest.Wait()
	})
}
