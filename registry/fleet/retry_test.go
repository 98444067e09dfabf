package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/registry/fleet/driver"
	"github.com/inflight-go/inflight/registry/fleet/memstore"
	"github.com/inflight-go/inflight/slots"
)

// failWaits is a store whose waiters' admission calls (Wait set) fail on
// the client's side while fail is above zero, one each: not run in the
// store, or, with late, run and then failed (as a call that timed out
// while the store ran it).
type failWaits struct {
	driver.Store
	fail     atomic.Int32
	late     bool
	err      error
	failed   atomic.Int32 // the waiters' calls failed so far
	answered atomic.Int32 // and those the store answered
}

func (s *failWaits) failing(c *driver.AdmitCall) bool {
	if !c.Wait {
		return false
	}
	for {
		n := s.fail.Load()
		if n <= 0 {
			return false
		}
		if s.fail.CompareAndSwap(n, n-1) {
			s.failed.Add(1)
			return true
		}
	}
}

func (s *failWaits) AdmitOne(ctx context.Context, c *driver.AdmitCall) (driver.AdmitResult, error) {
	if !s.failing(c) {
		res, err := s.Store.AdmitOne(ctx, c)
		if c.Wait && err == nil {
			s.answered.Add(1)
		}
		return res, err
	}
	if s.late {
		_, _ = s.Store.AdmitOne(context.Background(), c)
	}
	return driver.AdmitResult{Err: s.err}, s.err
}

func (s *failWaits) Admit(ctx context.Context, calls []*driver.AdmitCall) ([]driver.AdmitResult, error) {
	out := make([]driver.AdmitResult, len(calls))
	for i, c := range calls {
		out[i], _ = s.AdmitOne(ctx, c)
	}
	return out, nil
}

// holders counts the Slots held across the fleet on one key, and the most
// held at once.
type holders struct{ now, most atomic.Int32 }

func (h *holders) took() {
	n := h.now.Add(1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (h *holders) gave() { h.now.Add(-1) }

// A waiter whose calls time out while the breaker is still closed (a slow
// store times a call out now and then) asks again, and waits in the fleet's
// queue: it is admitted by the store once the holder in another process
// releases, not beside it under its own process's local registry alone,
// which would take the fleet over its cap of 1.
func TestWaiterRetriesAFailedCall(t *testing.T) {
	for _, tc := range []struct {
		name string
		late bool
		err  error
	}{
		{"timeout", false, fmt.Errorf("a slow store: %w", context.DeadlineExceeded)},
		{"net timeout", false, netTimeout{}},
		{"late", true, fmt.Errorf("ran, but the client gave up: %w", context.DeadlineExceeded)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := memstore.New()
			st := &failWaits{Store: ms, late: tc.late, err: tc.err}
			a := New[string](ms, 1, WithLogger(quiet()))
			t.Cleanup(func() { closeWithin(t, a) })
			b := New[string](st, 1, WithBreaker(5, time.Hour), WithUnavailable(FallbackLocal), WithLogger(quiet()))
			t.Cleanup(func() { closeWithin(t, b) })
			warm, err := b.TryAcquire("warm") // b knows the store's epoch
			require.NoError(t, err)
			warm.Release()

			var h holders
			held, err := a.TryAcquire("k")
			require.NoError(t, err)
			require.False(t, held.Degraded())
			h.took()

			const failures = 2
			st.fail.Store(failures)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound on a hang
			defer cancel()
			got := make(chan result, 1)
			go func() {
				s, err := b.Acquire(ctx, "k")
				if err == nil {
					h.took()
				}
				got <- result{s, err}
			}()
			// Its calls fail, then one queues it in the store; abandoned
			// (before the next call is made), the failed ones leave
			// nothing there.
			require.Eventually(t, func() bool {
				select {
				case res := <-got:
					got <- res
					return true // admitted (or failed) while the key was full: fails below
				default:
				}
				return st.failed.Load() == failures && st.answered.Load() >= 1 && ms.Queued("k") == 1
			}, 10*time.Second, time.Millisecond, "the waiter queues in the store after its failed calls")
			select {
			case res := <-got:
				if res.s != nil {
					t.Errorf("admitted while the fleet's cap of 1 was held elsewhere (degraded %v)", res.s.Degraded())
					res.s.Release()
				} else {
					t.Errorf("failed while the key was full: %v", res.err)
				}
				h.gave()
				t.FailNow()
			default:
			}
			n, err := a.InFlight(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, 1, n, "the store counts the holder alone")

			h.gave()
			held.Release() // the store grants the waiter
			var res result
			select {
			case res = <-got:
			case <-time.After(20 * time.Second): // a bound on a hang
				t.Fatal("the waiter was never admitted")
			}
			require.NoError(t, res.err)
			assert.False(t, res.s.Degraded(), "admitted by the store")
			assert.LessOrEqual(t, h.most.Load(), int32(1), "never more holders than the fleet's cap")
			n, err = a.InFlight(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, 1, n, "the store counts the waiter, now the holder")
			stats := b.Stats()
			assert.Zero(t, stats.Degraded)
			assert.False(t, stats.BreakerOpen)
			assert.Equal(t, uint64(failures), stats.StoreErrors)
			h.gave()
			res.s.Release()
			require.Eventually(t, func() bool {
				n, err := a.InFlight(context.Background(), "k")
				return err == nil && n == 0 && ms.Queued("k") == 0
			}, 10*time.Second, time.Millisecond, "nothing left in the store")
		})
	}
}

// netTimeout is a network error that timed out.
type netTimeout struct{}

func (netTimeout) Error() string { return "i/o timeout" }
func (netTimeout) Timeout() bool { return true }

// errSlow is a call's timeout, as the store's client returns it.
var errSlow = fmt.Errorf("a slow store: %w", context.DeadlineExceeded)

// A waiter decided as WithUnavailable says (here FallbackLocal: admitted
// under the local registry alone, Degraded): at once when its call fails
// otherwise than by a timeout (the store refused it: asked again, it would
// most likely fail again), and after its timeouts once they have opened
// the breaker (none asked after).
func TestWaiterDecidedAsUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		failed int32
		open   bool
	}{
		{"an error", errors.New("a store error"), 1, false},
		{"timeouts that open the breaker", errSlow, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := memstore.New()
			st := &failWaits{Store: ms, err: tc.err}
			a := New[string](ms, 1, WithLogger(quiet()))
			t.Cleanup(func() { closeWithin(t, a) })
			b := New[string](st, 1, WithBreaker(3, time.Hour), WithLogger(quiet()))
			t.Cleanup(func() { closeWithin(t, b) })
			held, err := a.TryAcquire("k")
			require.NoError(t, err)
			defer held.Release()
			st.fail.Store(1000)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound on a hang
			defer cancel()
			s, err := b.Acquire(ctx, "k")
			require.NoError(t, err)
			defer s.Release()
			assert.True(t, s.Degraded(), "admitted under the local registry alone")
			assert.Equal(t, tc.failed, st.failed.Load(), "failed calls")
			assert.Equal(t, tc.open, b.Stats().BreakerOpen)
		})
	}
}

// A waiter whose calls keep timing out while the breaker stays closed
// ends with its context, holding nothing, here or in the store.
func TestWaiterRetryEndsWithItsContext(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode Unavailable
	}{{"local", FallbackLocal}, {"closed", FailClosed}, {"open", FailOpen}} {
		mode := tc.mode
		t.Run(tc.name, func(t *testing.T) {
			ms := memstore.New()
			st := &failWaits{Store: ms, late: true, err: errSlow}
			b := New[string](st, 1, WithBreaker(1000, time.Hour), WithUnavailable(mode), WithLogger(quiet()))
			t.Cleanup(func() { closeWithin(t, b) })
			st.fail.Store(1 << 30)
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			s, err := b.Acquire(ctx, "k")
			if s != nil {
				s.Release()
			}
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Positive(t, st.failed.Load())
			assert.Zero(t, b.Local().InFlight("k"))
			assert.Zero(t, b.Stats().Held)
			require.Eventually(t, func() bool {
				n, err := ms.Count(context.Background(), "k")
				return err == nil && n == 0 && ms.Queued("k") == 0 && b.Stats().RemovalsPending == 0
			}, 10*time.Second, time.Millisecond, "what the failed calls added is taken back")
		})
	}
}

// With the longest wait (slots.WithMaxWait), a waiter whose calls keep
// timing out ends as a wait that ran out: a *slots.LimitError wrapping
// slots.ErrWaitTimeout.
func TestWaiterRetryEndsWithTheLongestWait(t *testing.T) {
	ms := memstore.New()
	st := &failWaits{Store: ms, err: errSlow}
	b := New[string](st, 1, WithBreaker(1000, time.Hour), WithLogger(quiet()),
		WithLocalOptions(slots.WithMaxWait(200*time.Millisecond)))
	t.Cleanup(func() { closeWithin(t, b) })
	st.fail.Store(1 << 30)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound on a hang
	defer cancel()
	s, err := b.Acquire(ctx, "k")
	if s != nil {
		s.Release()
	}
	require.ErrorIs(t, err, slots.ErrWaitTimeout)
	assert.Zero(t, b.Stats().Held)
}
