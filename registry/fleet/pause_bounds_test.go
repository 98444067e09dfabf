package fleet

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// A pause of new admissions after the store lost its data is no outage:
// the store is reachable, and the waiters that meet it wait through it
// ("still waiting, not an error"), whatever the local queue bounds, and
// are admitted once it ends if the key has room. Before its fix, the
// waiters held back in this process's order by a paused waiter were lined
// up against the local bounds, the paused one not counted: with
// WithMaxQueue(0), the second waiter of a pause failed with ErrQueueFull
// while the first was admitted after it, and the key had room for both.
func TestPausedWaitersAreNotBoundedAsInAnOutage(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		ms := memstore.New()
		r := New[string](ms, 4, WithLogger(quiet()), WithUnavailable(FallbackLocal),
			WithLocalOptions(slots.WithMaxQueue(0)))
		defer r.Close()
		s, err := r.TryAcquire("warm-up")
		require.NoError(t, err)
		s.Release()
		require.NotZero(t, r.epoch.Load())
		time.Sleep(time.Millisecond) // a new epoch, not the old one
		ms.Lose()
		errs := make(chan error, 3)
		for range 3 {
			go func() {
				s, err := r.Acquire(context.Background(), "k")
				if err == nil {
					s.Release()
				}
				errs <- err
			}()
			synctest.Wait()
		}
		require.Positive(t, r.Stats().Paused, "the waiters met the pause")
		for range 3 {
			assert.NoError(t, <-errs, "admitted after the pause: the key has room for all")
		}
	})
}
