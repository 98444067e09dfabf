package fleet

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// cutMidCall is a store whose next admission call, once armed, first runs cut: a
// cut of a learned cap that reaches the process while its admission call
// is on its way (on PostgreSQL, a call waiting for the key's row lock).
type cutMidCall struct {
	driver.Store
	armed atomic.Bool
	cut   func()
}

func (s *cutMidCall) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	if s.armed.CompareAndSwap(true, false) {
		s.cut()
	}
	return s.Store.Admit(ctx, calls)
}

func (s *cutMidCall) AdmitOne(ctx context.Context, call *driver.AdmitCall) (driver.AdmitResult, error) {
	if s.armed.CompareAndSwap(true, false) {
		s.cut()
	}
	return s.Store.AdmitOne(ctx, call)
}

// An admission whose call went with a learned limit that a cut lowered
// before the reply came is not handed out when its count is over the new
// cap: the upstream would refuse it. A TryAcquire is refused as under a
// full key; an Acquire waits, and is admitted once the count is within
// the cap; the lease given back leaves the store (no capacity is lost).
func TestAdmissionOverACutMeanwhileIsGivenBack(t *testing.T) {
	for _, wait := range []bool{false, true} {
		name := "TryAcquire"
		if wait {
			name = "Acquire"
		}
		t.Run(name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				s := &cutMidCall{Store: memstore.New()}
				r := New[string](s, 100, WithLogger(quiet()))
				defer r.Close()
				require.NoError(t, r.Learn("p", pacing.AdaptiveConfig{Initial: 10, Max: 10}))
				synctest.Wait()
				var held []*slots.Slot
				for range 9 { // starts a millisecond apart: each its own number
					time.Sleep(time.Millisecond)
					held = append(held, holdP(t, 1, r)...)
				}
				require.Equal(t, 10, r.Limit("p"))
				// The ninth start is refused by the upstream, and reported
				// while the tenth's call is on its way with limit 10.
				s.cut = func() { r.Report(held[8], pacing.Verdict{Kind: pacing.Concurrency}) }
				s.armed.Store(true)
				if !wait {
					_, err := r.TryAcquire("p")
					var le *slots.LimitError
					require.True(t, errors.As(err, &le), "admitted at 10 over a cap cut to %d: %v", r.Limit("p"), err)
					assert.ErrorIs(t, err, slots.ErrLimitReached)
					assert.Equal(t, "p", le.Key)
					assert.Equal(t, 9, le.InFlight)
				} else {
					got := make(chan error, 1)
					go func() {
						sl, err := r.Acquire(context.Background(), "p")
						if err == nil {
							sl.Release()
						}
						got <- err
					}()
					synctest.Wait()
					select {
					case err := <-got:
						t.Fatalf("the waiter returned (%v) at a count over the cap cut to %d", err, r.Limit("p"))
					default:
					}
					for _, sl := range held {
						sl.Release()
					}
					held = nil
					require.NoError(t, <-got, "admitted once the count is within the cap")
				}
				assert.False(t, s.armed.Load(), "the cut came mid-call")
				assert.Less(t, r.Limit("p"), 10, "the cap was cut")
				assert.Equal(t, len(held), r.Stats().Held)
				for _, sl := range held {
					sl.Release()
				}
				// Nothing left in the store: every slot of the cap, as it
				// stands, can be taken.
				synctest.Wait() // the releases reach the store
				n, err := r.InFlight(context.Background(), "p")
				require.NoError(t, err)
				assert.Zero(t, n, "the lease given back left the store")
				n = r.Limit("p")
				again := holdP(t, n, r)
				for _, sl := range again {
					sl.Release()
				}
			})
		})
	}
}
