package slots_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// probe runs n concurrent acquirers that hold until told to go, counting
// how many hold at once with a counter of its own.
type probe struct {
	cur, peak, done atomic.Int64
	release         chan struct{}
}

func runProbe(t *testing.T, l *slots.Limiter, n int) *probe {
	p := &probe{release: make(chan struct{})}
	for range n {
		go func() {
			s, err := l.Acquire(context.Background())
			if !assert.NoError(t, err) {
				return
			}
			c := p.cur.Add(1)
			for {
				pk := p.peak.Load()
				if c <= pk || p.peak.CompareAndSwap(pk, c) {
					break
				}
			}
			<-p.release
			p.cur.Add(-1)
			s.Release()
			p.done.Add(1)
		}()
	}
	return p
}

func TestLimiterProbe(t *testing.T) {
	t.Run("five acquirers on a limit of two: two hold, three wait, all finish", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			l := slots.NewLimiter(2)
			p := runProbe(t, l, 5)
			synctest.Wait()
			assert.Equal(t, int64(2), p.cur.Load())
			assert.Equal(t, 2, l.InFlight())
			assert.Equal(t, 3, l.Waiting())
			for i := range 5 {
				p.release <- struct{}{}
				synctest.Wait()
				assert.Equal(t, int64(i+1), p.done.Load())
				assert.LessOrEqual(t, l.InFlight(), 2)
			}
			assert.Equal(t, int64(2), p.peak.Load())
			assert.Equal(t, 0, l.InFlight())
			assert.Equal(t, 0, l.Waiting())
		})
	})
	t.Run("unlimited: all five hold at once", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			l := slots.NewLimiter(slots.Unlimited)
			p := runProbe(t, l, 5)
			synctest.Wait()
			assert.Equal(t, int64(5), p.peak.Load())
			assert.Equal(t, 0, l.Waiting())
			close(p.release)
			synctest.Wait()
			assert.Equal(t, int64(5), p.done.Load())
		})
	})
}

func TestLimiterServesWaitersInArrivalOrder(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(1)
		first, err := l.TryAcquire()
		require.NoError(t, err)
		var order []int
		var mu sync.Mutex
		got := make(chan *slots.Slot)
		for i := range 5 {
			go func() {
				s, err := l.Acquire(context.Background())
				if assert.NoError(t, err) {
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					got <- s
				}
			}()
			synctest.Wait() // i is queued before i+1 starts
		}
		first.Release()
		for range 5 {
			s := <-got
			// Not even TryAcquire passes the waiters still queued.
			_, err := l.TryAcquire()
			assert.ErrorIs(t, err, slots.ErrLimitReached)
			s.Release()
		}
		assert.Equal(t, []int{0, 1, 2, 3, 4}, order)
	})
}

func TestLimiterTryAcquire(t *testing.T) {
	l := slots.NewLimiter(1)
	s, err := l.TryAcquire()
	require.NoError(t, err)
	_, err = l.TryAcquire()
	var le *slots.LimitError
	require.ErrorAs(t, err, &le)
	assert.ErrorIs(t, err, slots.ErrLimitReached)
	assert.Equal(t, 1, le.InFlight)
	assert.Equal(t, 1, le.Limit)
	assert.Equal(t, 0, le.Queued)
	assert.GreaterOrEqual(t, le.RetryAfter, time.Second)
	assert.Contains(t, err.Error(), "slots: limit reached")
	assert.True(t, s.Release())
	s2, err := l.TryAcquire()
	require.NoError(t, err)
	s2.Release()
	st := l.Stats()
	assert.Equal(t, uint64(2), st.Acquired)
	assert.Equal(t, uint64(1), st.LimitReached)
	assert.Equal(t, uint64(2), st.Released)
}

func TestLimiterMaxQueue(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(1, slots.WithMaxQueue(2))
		held, err := l.TryAcquire()
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for range 2 {
			go func() { _, _ = l.Acquire(ctx) }()
		}
		synctest.Wait()
		require.Equal(t, 2, l.Waiting())

		_, err = l.Acquire(ctx)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.ErrorIs(t, err, slots.ErrQueueFull)
		assert.Equal(t, 2, le.Queued)
		assert.Equal(t, 1, le.InFlight)
		assert.Equal(t, uint64(1), l.Stats().QueueFull)
		cancel()
		synctest.Wait()
		assert.Equal(t, 0, l.Waiting())
		held.Release()
	})
	t.Run("a queue of zero never waits", func(t *testing.T) {
		l := slots.NewLimiter(1, slots.WithMaxQueue(0))
		s, err := l.Acquire(context.Background())
		require.NoError(t, err)
		_, err = l.Acquire(context.Background())
		assert.ErrorIs(t, err, slots.ErrQueueFull)
		s.Release()
	})
}

func TestLimiterMaxWait(t *testing.T) {
	t.Run("fail-closed: ErrWaitTimeout after exactly the max wait", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			l := slots.NewLimiter(1, slots.WithMaxWait(30*time.Second))
			held, _ := l.TryAcquire()
			start := time.Now()
			_, err := l.Acquire(context.Background())
			assert.ErrorIs(t, err, slots.ErrWaitTimeout)
			assert.Equal(t, 30*time.Second, time.Since(start))
			assert.Equal(t, 0, l.Waiting())
			assert.Equal(t, uint64(1), l.Stats().WaitTimeouts)
			held.Release()
		})
	})
	t.Run("fail-open: a bypassed slot that holds no capacity, logged once per interval", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			var logs logSink
			l := slots.NewLimiter(1, slots.WithMaxWait(time.Second), slots.WithFailOpen(), slots.WithLogger(logs.logger()))
			held, _ := l.TryAcquire()
			var bypassed []*slots.Slot
			for range 3 {
				s, err := l.Acquire(context.Background())
				require.NoError(t, err)
				assert.True(t, s.Bypassed())
				bypassed = append(bypassed, s)
			}
			assert.Equal(t, 1, l.InFlight(), "bypassed slots take no capacity")
			assert.Equal(t, uint64(3), l.Stats().Bypassed)
			assert.Equal(t, 1, logs.count("saturated"), "3 bypasses within 3s log once")
			time.Sleep(10 * time.Second) // fake time inside the bubble
			s, err := l.Acquire(context.Background())
			require.NoError(t, err)
			assert.True(t, s.Bypassed())
			assert.Equal(t, 2, logs.count("saturated"))
			for _, b := range append(bypassed, s) {
				assert.True(t, b.Release())
			}
			assert.Equal(t, 1, l.InFlight(), "releasing bypassed slots frees nothing")
			held.Release()
			assert.Equal(t, 0, l.InFlight())
		})
	})
	t.Run("a grant before the max wait wins", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			l := slots.NewLimiter(1, slots.WithMaxWait(time.Minute))
			held, _ := l.TryAcquire()
			go func() {
				time.Sleep(59 * time.Second)
				held.Release()
			}()
			s, err := l.Acquire(context.Background())
			require.NoError(t, err)
			assert.False(t, s.Bypassed())
			s.Release()
		})
	})
}

func TestLimiterSetLimit(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var logs logSink
		l := slots.NewLimiter(0, slots.WithLogger(logs.logger()))
		_, err := l.TryAcquire()
		assert.ErrorIs(t, err, slots.ErrLimitReached, "limit 0 admits nothing")

		got := make(chan *slots.Slot, 3)
		for range 3 {
			go func() {
				s, err := l.Acquire(context.Background())
				if assert.NoError(t, err) {
					got <- s
				}
			}()
		}
		synctest.Wait()
		assert.Equal(t, 3, l.Waiting())
		l.SetLimit(2) // raising admits waiters at once
		synctest.Wait()
		assert.Equal(t, 2, l.InFlight())
		assert.Equal(t, 1, l.Waiting())

		l.SetLimit(1) // lowering evicts nobody
		assert.Equal(t, 2, l.InFlight())
		(<-got).Release()
		synctest.Wait()
		assert.Equal(t, 1, l.InFlight(), "still at the lowered limit: nobody admitted")
		assert.Equal(t, 1, l.Waiting())
		(<-got).Release()
		synctest.Wait()
		assert.Equal(t, 1, l.InFlight(), "the waiter got the freed slot")
		(<-got).Release()

		l.SetLimit(-1)
		assert.Equal(t, 1, l.Limit(), "a negative limit is ignored")
		assert.Equal(t, 1, logs.count("negative"), "and logged")
	})
}

func TestLimiterBadInput(t *testing.T) {
	t.Run("negative limit at construction panics with the package prefix", func(t *testing.T) {
		assert.PanicsWithValue(t, "slots: negative limit -1", func() { slots.NewLimiter(-1) })
	})
	t.Run("nil context is an error", func(t *testing.T) {
		l := slots.NewLimiter(1)
		//lint:ignore SA1012 the point of the test
		_, err := l.Acquire(nil) //nolint:staticcheck
		assert.ErrorIs(t, err, slots.ErrNilContext)
		assert.Equal(t, 0, l.InFlight())
	})
	t.Run("a done context fails even when a slot is free", func(t *testing.T) {
		l := slots.NewLimiter(1)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := l.Acquire(ctx)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 0, l.InFlight())
	})
	t.Run("release twice is a counted no-op", func(t *testing.T) {
		l := slots.NewLimiter(1)
		s, _ := l.TryAcquire()
		assert.True(t, s.Release())
		assert.False(t, s.Release())
		assert.True(t, s.Released())
		assert.Equal(t, uint64(1), l.Stats().DoubleReleases)
		a, err := l.TryAcquire()
		require.NoError(t, err)
		_, err = l.TryAcquire()
		assert.ErrorIs(t, err, slots.ErrLimitReached, "a double release must not add capacity")
		a.Release()
	})
	t.Run("release from other goroutines: exactly one frees", func(t *testing.T) {
		l := slots.NewLimiter(1)
		s, _ := l.TryAcquire()
		var freed atomic.Int32
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if s.Release() {
					freed.Add(1)
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int32(1), freed.Load())
		assert.Equal(t, uint64(7), l.Stats().DoubleReleases)
		assert.Equal(t, 0, l.InFlight())
	})
	t.Run("a nil slot is inert", func(t *testing.T) {
		var s *slots.Slot
		assert.False(t, s.Release())
		assert.True(t, s.Released())
		assert.False(t, s.Bypassed())
		assert.True(t, s.AcquiredAt().IsZero())
	})
	t.Run("the zero Limiter admits nothing until raised", func(t *testing.T) {
		var l slots.Limiter
		_, err := l.TryAcquire()
		assert.ErrorIs(t, err, slots.ErrLimitReached)
		l.SetLimit(1)
		s, err := l.TryAcquire()
		require.NoError(t, err)
		assert.False(t, s.AcquiredAt().IsZero())
		s.Release()
	})
}

func TestLimiterInjectedClock(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	l := slots.NewLimiter(1, slots.WithClock(mock))
	s, err := l.TryAcquire()
	require.NoError(t, err)
	assert.True(t, s.AcquiredAt().Equal(mock.Now()))
	for _, d := range []time.Duration{601 * time.Second, 400 * time.Second} {
		mock.Add(d)
		_, err = l.TryAcquire()
		assert.ErrorIs(t, err, slots.ErrLimitReached, "time never frees a slot")
	}
	h := l.Holders(nil)
	require.Len(t, h, 1)
	assert.Equal(t, s.ID(), h[0].ID)
	assert.Equal(t, 1001*time.Second, mock.Now().Sub(h[0].AcquiredAt))
	s.Release()
	s2, err := l.TryAcquire()
	require.NoError(t, err)
	s2.Release()
}

// TestLimiterCancelRacingGrant races a waiter's cancellation against the
// release that grants it. Whichever wins, the capacity must come back.
func TestLimiterCancelRacingGrant(t *testing.T) {
	l := slots.NewLimiter(1)
	for range 2000 {
		held, err := l.TryAcquire()
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() {
			s, err := l.Acquire(ctx)
			if err == nil {
				s.Release()
			}
			res <- err
		}()
		for l.Waiting() == 0 && l.InFlight() == 1 && len(res) == 0 {
			// Spin until the waiter is queued (or done); no sleeping.
			runtimeGosched()
		}
		released := make(chan struct{})
		go func() { held.Release(); close(released) }()
		cancel()
		<-released
		if err := <-res; err != nil {
			require.ErrorIs(t, err, context.Canceled)
		}
		require.Equal(t, 0, l.InFlight())
		require.Equal(t, 0, l.Waiting())
	}
	s, err := l.TryAcquire()
	require.NoError(t, err, "no capacity lost")
	s.Release()
}

// TestLimiterHammer: 64 goroutines mix TryAcquire, Acquire with random
// cancellation and timeouts, and SetLimit; an independent counter checks the
// cap at every admission.
func TestLimiterHammer(t *testing.T) {
	const maxLimit, goroutines, iters = 8, 64, 50
	l := slots.NewLimiter(maxLimit, slots.WithMaxWait(2*time.Millisecond))
	var inFlight, admitted, rejected, attempts atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range iters {
				attempts.Add(1)
				var s *slots.Slot
				var err error
				switch rng.IntN(4) {
				case 0:
					s, err = l.TryAcquire()
				case 1:
					l.SetLimit(1 + rng.IntN(maxLimit))
					s, err = l.TryAcquire()
				default:
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(2) == 0 {
						go cancel()
					}
					s, err = l.Acquire(ctx)
					cancel()
				}
				if err != nil {
					rejected.Add(1)
					continue
				}
				admitted.Add(1)
				if n := inFlight.Add(1); n > maxLimit {
					t.Errorf("%d in flight, over the limit %d", n, maxLimit)
				}
				if rng.IntN(2) == 0 {
					runtimeGosched()
				}
				inFlight.Add(-1)
				require.True(t, s.Release())
			}
		})
	}
	wg.Wait()
	assert.Equal(t, attempts.Load(), admitted.Load()+rejected.Load())
	assert.Positive(t, admitted.Load())
	assert.Equal(t, 0, l.InFlight())
	assert.Equal(t, 0, l.Waiting())
}

func TestLimiterAllocs(t *testing.T) {
	l := slots.NewLimiter(8)
	allocs := testing.AllocsPerRun(1000, func() {
		s, err := l.TryAcquire()
		if err != nil {
			panic(err)
		}
		s.Release()
	})
	assert.LessOrEqual(t, allocs, 1.0, "TryAcquire+Release allocates the Slot only")
}

func TestLimitErrorFormat(t *testing.T) {
	err := &slots.LimitError{Err: slots.ErrQueueFull, Key: "org-a", InFlight: 4, Limit: slots.Unlimited, Queued: 9, RetryAfter: 2 * time.Second}
	assert.Equal(t, `slots: queue full (key "org-a": 4 in flight, limit unlimited, 9 queued; retry after 2s)`, err.Error())
	assert.True(t, errors.Is(err, slots.ErrQueueFull))
	err.Cap = "provider" // an owner of several caps names the one that refused, beside its key
	assert.Equal(t, `slots: queue full (key "org-a", cap "provider": 4 in flight, limit unlimited, 9 queued; retry after 2s)`, err.Error())
	err.Key = ""
	assert.Equal(t, `slots: queue full (cap "provider": 4 in flight, limit unlimited, 9 queued; retry after 2s)`, err.Error())
	err.Key, err.Cap = "", ""
	assert.Equal(t, `slots: queue full (4 in flight, limit unlimited, 9 queued; retry after 2s)`, err.Error())
	// A budget per minute (its Cap ends so) counts what started in the
	// last minute, not what is in flight.
	err = &slots.LimitError{Err: slots.ErrLimitReached, Key: "openai", Cap: "tokens_per_minute", InFlight: 9000, Limit: 10000, RetryAfter: time.Second}
	assert.Equal(t, `slots: limit reached (key "openai", cap "tokens_per_minute": 9000 started in the last minute, limit 10000, 0 queued; retry after 1s)`, err.Error())
}

// logSink collects log records for assertions.
type logSink struct {
	mu   sync.Mutex
	msgs []string
}

func (s *logSink) logger() *slog.Logger { return slog.New(sinkHandler{s}) }

func (s *logSink) count(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

type sinkHandler struct{ s *logSink }

func (h sinkHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h sinkHandler) Handle(_ context.Context, r slog.Record) error {
	h.s.mu.Lock()
	h.s.msgs = append(h.s.msgs, r.Message)
	h.s.mu.Unlock()
	return nil
}
func (h sinkHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h sinkHandler) WithGroup(string) slog.Handler      { return h }

// TestNilOptionsAreIgnored: a nil option configures nothing, on every
// constructor of the package, rather than a nil call's panic.
func TestNilOptionsAreIgnored(t *testing.T) {
	lim := slots.NewLimiter(1, nil, slots.WithMaxQueue(0), nil)
	s, err := lim.TryAcquire()
	require.NoError(t, err)
	_, err = lim.Acquire(context.Background())
	assert.ErrorIs(t, err, slots.ErrQueueFull, "the option beside the nils holds")
	s.Release()
	assert.NotNil(t, slots.NewTransport(http.DefaultTransport, func(*http.Request) (*slots.Slot, error) { return nil, nil }, nil))
	assert.NotNil(t, slots.Middleware(func(*http.Request) (*slots.Slot, error) { return nil, nil }, nil))
}

// TestZeroLimitersKeepTheirOwnCounts: zero-value Limiters are apart, as
// made ones are: misuse on one is not counted on another.
func TestZeroLimitersKeepTheirOwnCounts(t *testing.T) {
	var a, b slots.Limiter
	a.SetLimit(1)
	b.SetLimit(1)
	s, err := a.TryAcquire()
	require.NoError(t, err)
	s.Release()
	s.Release()
	assert.Equal(t, uint64(1), a.Stats().DoubleReleases)
	assert.Equal(t, uint64(0), b.Stats().DoubleReleases, "b saw no misuse")
}
