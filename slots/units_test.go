package slots_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/core"
	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

func TestLimiterCountsUnits(t *testing.T) {
	l := slots.NewLimiter(10)
	a, err := l.TryAcquireN(4)
	require.NoError(t, err)
	b, err := l.TryAcquireN(6)
	require.NoError(t, err)
	assert.Equal(t, 4, a.Units())
	assert.Equal(t, 6, b.Units())
	assert.Equal(t, 10, l.InFlight())

	_, err = l.TryAcquire()
	assert.ErrorIs(t, err, slots.ErrLimitReached, "10 of 10 units held")
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 10, le.InFlight, "InFlight counts units")

	require.True(t, a.Release())
	assert.Equal(t, 6, l.InFlight(), "a release frees exactly the units it took")
	c, err := l.TryAcquireN(4)
	require.NoError(t, err)
	_, err = l.TryAcquire()
	assert.ErrorIs(t, err, slots.ErrLimitReached)

	hs := l.Holders(nil)
	units := 0
	for _, h := range hs {
		units += h.Units
	}
	assert.Equal(t, 10, units)
	st := l.Stats()
	assert.Equal(t, 10, st.InFlight)
	assert.Equal(t, uint64(3), st.Acquired, "admissions are counted once each, whatever they weigh")

	b.Release()
	c.Release()
	assert.False(t, b.Release(), "a second release frees nothing")
	assert.Equal(t, 0, l.InFlight())
	one, err := l.TryAcquire()
	require.NoError(t, err)
	assert.Equal(t, 1, one.Units())
	one.Release()
	assert.Equal(t, 0, (*slots.Slot)(nil).Units())
}

func TestLimiterRefusesUnitsOutOfRange(t *testing.T) {
	l := slots.NewLimiter(10)
	for _, n := range []int{0, -1, slots.MaxUnits + 1} {
		_, err := l.TryAcquireN(n)
		assert.ErrorIs(t, err, slots.ErrBadUnits, "TryAcquireN(%d)", n)
		_, err = l.AcquireN(context.Background(), n)
		assert.ErrorIs(t, err, slots.ErrBadUnits, "AcquireN(%d)", n)
	}
	_, err := l.AcquireN(nil, 2) //nolint:staticcheck // a nil context is what is tested
	assert.ErrorIs(t, err, slots.ErrNilContext)
	assert.Equal(t, 0, l.InFlight())
	assert.Equal(t, uint64(0), l.Stats().Acquired)
}

// A caller heavier than the limit is refused at once, never queued; a
// limit of 0 is a pause, so there it waits, and is refused when the limit
// comes back lower than its weight.
func TestLimiterRefusesMoreThanTheLimit(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10)
		_, err := l.TryAcquireN(11)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit)
		_, err = l.AcquireN(context.Background(), 11)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit, "refused at once: it would wait forever")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 10, le.Limit)
		assert.Equal(t, uint64(2), l.Stats().ExceedsLimit)
		assert.Equal(t, 0, l.Waiting())

		full, err := l.AcquireN(context.Background(), 10)
		require.NoError(t, err, "the whole limit is not too heavy")
		full.Release()

		l.SetLimit(0)
		errc := make(chan error, 1)
		go func() {
			s, err := l.AcquireN(context.Background(), 5)
			if err == nil {
				s.Release()
			}
			errc <- err
		}()
		synctest.Wait()
		assert.Equal(t, 1, l.Waiting(), "a limit of 0 pauses: the caller waits")
		l.SetLimit(4)
		synctest.Wait()
		err = <-errc
		assert.ErrorIs(t, err, slots.ErrExceedsLimit, "a limit lowered below a waiter's weight refuses it")
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 4, le.Limit)
		assert.Equal(t, 0, l.Waiting())
		assert.Equal(t, uint64(3), l.Stats().ExceedsLimit)

		l.SetLimit(0)
		go func() {
			s, err := l.AcquireN(context.Background(), 5)
			if err == nil {
				s.Release()
			}
			errc <- err
		}()
		synctest.Wait()
		l.SetLimit(5)
		assert.NoError(t, <-errc, "a limit raised to its weight admits it")
	})
}

// A caller waiting for n units that do not fit lets the callers after it
// (of its flow) take free units until they have taken core.PassFactor
// times n; from then on it keeps its place: later callers, even those
// that would fit, wait until it is served, as soon as n are free.
func TestLimiterHeavyWaiterIsPassedUpToItsBound(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10)
		a, err := l.TryAcquireN(4)
		require.NoError(t, err)
		b, err := l.TryAcquireN(4)
		require.NoError(t, err)

		var mu sync.Mutex
		var order []string
		held := map[string]*slots.Slot{}
		acquire := func(name string, n int) {
			go func() {
				s, err := l.AcquireN(context.Background(), n)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				order = append(order, name)
				held[name] = s
				mu.Unlock()
			}()
			synctest.Wait()
		}
		release := func(name string) {
			mu.Lock()
			s := held[name]
			mu.Unlock()
			s.Release()
			synctest.Wait()
		}
		passers := 4 * core.PassFactor / 2 // callers of 2 units passing one of 4
		acquire("heavy", 4)
		var want []string
		for i := 1; i <= passers+1; i++ {
			acquire(fmt.Sprint("light", i), 2)
			want = append(want, fmt.Sprint("light", i))
		}
		assert.Equal(t, 10, l.InFlight(), "light1 passed the heavy caller: 2 units were free")
		assert.Equal(t, passers+1, l.Waiting())
		for i := 1; i < passers; i++ {
			release(fmt.Sprint("light", i)) // the next light caller passes
			assert.Equal(t, 10, l.InFlight())
		}
		release(fmt.Sprint("light", passers)) // it has been passed by its bound
		assert.Equal(t, 8, l.InFlight(), "2 units free, but the heavy caller keeps its place now")
		assert.Equal(t, 2, l.Waiting())
		_, err = l.TryAcquire()
		assert.ErrorIs(t, err, slots.ErrLimitReached, "TryAcquire does not pass it either")

		a.Release()
		synctest.Wait()
		assert.Equal(t, 10, l.InFlight(), "6 free: the heavy caller took 4, then the last light one 2")
		mu.Lock()
		if assert.Len(t, order, passers+2) {
			assert.Equal(t, want[:passers], order[:passers])
			assert.ElementsMatch(t, []string{"heavy", want[passers]}, order[passers:], "granted together")
		}
		mu.Unlock()
		release("heavy")
		release(fmt.Sprint("light", passers+1))
		b.Release()
		assert.Equal(t, 0, l.InFlight())
	})
}

// passUnits makes n callers of one unit at ctx pass l's blocked waiter,
// each taking and giving back its unit, so that the waiter keeps its
// place from then on.
func passUnits(t *testing.T, l *slots.Limiter, ctx context.Context, n int) {
	t.Helper()
	for range n {
		s, err := l.AcquireN(ctx, 1)
		require.NoError(t, err)
		s.Release()
	}
}

// A heavy waiter that keeps its place (it has been passed by its bound)
// and leaves (its context ends, or its limit drops below it) gives
// the units it kept to the callers after it at once.
func TestLimiterHeavyWaiterThatLeavesServesTheRest(t *testing.T) {
	for _, leave := range []string{"cancel", "timeout", "lowered limit"} {
		t.Run(leave, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				var opts []slots.Option
				if leave == "timeout" {
					opts = append(opts, slots.WithMaxWait(time.Second))
				}
				l := slots.NewLimiter(10, opts...)
				a, err := l.TryAcquireN(7)
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				heavy := make(chan error, 1)
				go func() {
					_, err := l.AcquireN(ctx, 6)
					heavy <- err
				}()
				synctest.Wait()
				passUnits(t, l, context.Background(), 6*core.PassFactor)
				// Virtual time: the light callers come half a second
				// later, so they time out after the heavy one.
				time.Sleep(500 * time.Millisecond)
				light := make(chan *slots.Slot, 2)
				for range 2 {
					go func() {
						s, err := l.AcquireN(context.Background(), 1)
						assert.NoError(t, err)
						light <- s
					}()
				}
				synctest.Wait()
				assert.Equal(t, 3, l.Waiting())

				switch leave {
				case "cancel":
					cancel()
					assert.ErrorIs(t, <-heavy, context.Canceled)
				case "timeout":
					time.Sleep(500 * time.Millisecond) // the heavy waiter's MaxWait is up
					assert.ErrorIs(t, <-heavy, slots.ErrWaitTimeout)
				case "lowered limit":
					l.SetLimit(5)
					assert.ErrorIs(t, <-heavy, slots.ErrExceedsLimit)
					l.SetLimit(10)
				}
				synctest.Wait()
				s1, s2 := <-light, <-light
				assert.Equal(t, 9, l.InFlight(), "both light callers were served once it left")
				s1.Release()
				s2.Release()
				a.Release()
				assert.Equal(t, 0, l.InFlight())
				assert.Equal(t, 0, l.Waiting())
			})
		})
	}
}

// With shares, what the other classes reserve can never be taken by a
// class: a caller heavier than the rest is refused at once.
func TestLimiterUnitsWithShares(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(10, slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 4}))
		batch := slots.WithPriority(context.Background(), slots.PriorityBatch)
		_, err := l.AcquireN(batch, 7)
		assert.ErrorIs(t, err, slots.ErrExceedsLimit, "4 of 10 are reserved for another class")
		s, err := l.AcquireN(batch, 6)
		require.NoError(t, err)
		_, err = l.TryAcquireN(1)
		assert.ErrorIs(t, err, slots.ErrLimitReached, "the reserve is kept from the default class")
		interactive, err := l.AcquireN(slots.WithPriority(context.Background(), slots.PriorityInteractive), 4)
		require.NoError(t, err, "and taken by its own")
		assert.Equal(t, 10, l.InFlight())
		interactive.Release()
		s.Release()
	})
}

// A fail-open admission weighs its units but holds none of them.
func TestLimiterBypassHoldsNoUnits(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(4, slots.WithMaxWait(time.Second), slots.WithFailOpen())
		a, err := l.TryAcquireN(4)
		require.NoError(t, err)
		s, err := l.AcquireN(context.Background(), 3)
		require.NoError(t, err)
		assert.True(t, s.Bypassed())
		assert.Equal(t, 4, l.InFlight())
		s.Release()
		a.Release()
		assert.Equal(t, 0, l.InFlight())
	})
}

// TestLimiterUnitsHammer: 48 goroutines take 1 to 5 units at once with
// TryAcquireN and AcquireN, with cancellations racing their grants,
// timeouts, and the limit moving between 8 and 12; an independent count
// of units checks the cap at every admission.
func TestLimiterUnitsHammer(t *testing.T) {
	const maxLimit, goroutines, iters = 12, 48, 60
	l := slots.NewLimiter(maxLimit, slots.WithMaxWait(2*time.Millisecond))
	var inFlight, admitted, rejected, attempts atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for range iters {
				attempts.Add(1)
				n := 1 + rng.IntN(5)
				var s *slots.Slot
				var err error
				switch rng.IntN(5) {
				case 0:
					s, err = l.TryAcquireN(n)
				case 1:
					l.SetLimit(8 + 4*rng.IntN(2))
					s, err = l.TryAcquireN(n)
				default:
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(2) == 0 {
						go cancel()
					}
					s, err = l.AcquireN(ctx, n)
					cancel()
				}
				if err != nil {
					var le *slots.LimitError
					if !errors.As(err, &le) && !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error: %v", err)
					}
					rejected.Add(1)
					continue
				}
				admitted.Add(1)
				if s.Units() != n {
					t.Errorf("a slot of %d units for %d asked", s.Units(), n)
				}
				if got := inFlight.Add(int64(n)); got > maxLimit {
					t.Errorf("%d units in flight, over the limit %d", got, maxLimit)
				}
				if rng.IntN(2) == 0 {
					runtimeGosched()
				}
				inFlight.Add(-int64(n))
				require.True(t, s.Release())
			}
		})
	}
	wg.Wait()
	assert.Equal(t, attempts.Load(), admitted.Load()+rejected.Load())
	assert.Positive(t, admitted.Load())
	assert.Equal(t, 0, l.InFlight())
	assert.Equal(t, 0, l.Waiting())
	t.Logf("%d admitted, %d refused", admitted.Load(), rejected.Load())
}

func TestLimiterUnitsAllocs(t *testing.T) {
	l := slots.NewLimiter(8)
	allocs := testing.AllocsPerRun(1000, func() {
		s, err := l.TryAcquireN(3)
		if err != nil {
			panic(err)
		}
		s.Release()
	})
	assert.LessOrEqual(t, allocs, 1.0, "TryAcquireN+Release allocates the Slot only")
}

// Events carry the units of what they report, and a Slot tracked for
// leaks reports its units like any other.
func TestLimiterUnitsInEvents(t *testing.T) {
	var mu sync.Mutex
	got := map[slots.EventKind][]int{}
	obs := slots.ObserverFunc(func(e slots.Event) {
		mu.Lock()
		got[e.Kind] = append(got[e.Kind], e.Units)
		mu.Unlock()
	})
	l := slots.NewLimiter(10, slots.WithObserver(obs), slots.WithLeakDetection())
	s, err := l.TryAcquireN(4)
	require.NoError(t, err)
	assert.Equal(t, 4, s.Units())
	one, err := l.TryAcquire()
	require.NoError(t, err)
	_, err = l.TryAcquireN(6)
	require.Error(t, err)
	s.Release()
	one.Release()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{4, 1}, got[slots.EventAcquired])
	assert.Equal(t, []int{0}, got[slots.EventRejected])
	assert.Equal(t, []int{4, 1}, got[slots.EventReleased])
}

// A caller heavier than its cap is answered 413 without a Retry-After:
// coming back cannot help. Its LimitError carries none either, for a Go
// caller that reads it (see also registry's TestExceedsLimitNoRetryAfter).
func TestExceedsLimitAnswer(t *testing.T) {
	l := slots.NewLimiter(10)
	warm, err := l.TryAcquire()
	require.NoError(t, err)
	warm.Release() // a hold time known: a Retry-After could be estimated
	_, err = l.TryAcquireN(11)
	require.ErrorIs(t, err, slots.ErrExceedsLimit)
	status, retry := slots.HTTPStatus(err)
	assert.Equal(t, 413, status)
	assert.Zero(t, retry)
	assert.Equal(t, "the request weighs more than its cap can ever hold (limit 10)", slots.ErrorMessage(err))
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.Zero(t, le.RetryAfter)
	assert.NotContains(t, err.Error(), "retry after")
}
