package slots_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

var (
	interactive = slots.WithPriority(context.Background(), slots.PriorityInteractive)
	batch       = slots.WithPriority(context.Background(), slots.PriorityBatch)
)

// Cap 4 saturated by batch with 100 batch waiters queued: an interactive
// request is admitted at the next release, not after the 100.
func TestLimiterInteractiveJumpsBatch(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(4)
		r := testrig.New(t, l.Acquire)
		for range 104 {
			r.Add(batch, "batch")
		}
		r.Add(interactive, "interactive")
		require.Equal(t, 4, l.InFlight())
		q := l.Queue()
		assert.Equal(t, 101, q.Waiting)
		assert.Equal(t, 100, q.Batch)
		assert.Equal(t, 1, q.Interactive)

		r.ReleaseOldest()
		assert.Equal(t, "interactive", r.Order()[4], "admitted at the next release")
		r.ReleaseAll()
		assert.Zero(t, l.Waiting())
		assert.Zero(t, l.InFlight())
	})
}

// With a batch minimum share of 1, sustained interactive load still admits
// batch: whenever batch holds less than its share, the next free slot is
// batch's. With holds of equal length that is one grant in four.
func TestLimiterBatchMinShare(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(4, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
		r := testrig.New(t, l.Acquire)
		r.CheckMinShare(interactive, batch)
		r.ReleaseAll()
		assert.Zero(t, l.InFlight())
	})
}

// Without a share, sustained interactive load holds batch back entirely:
// the share is what makes the difference above.
func TestLimiterStrictPriorityWithoutShare(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(4)
		r := testrig.New(t, l.Acquire)
		for range 4 {
			r.Add(interactive, "i")
		}
		for range 5 {
			r.Add(batch, "b")
		}
		for range 40 {
			r.Add(interactive, "i")
		}
		for range 40 {
			r.ReleaseOldest()
		}
		assert.NotContains(t, r.Order(), "b")
		r.ReleaseAll()
		assert.Equal(t, "b", r.Order()[len(r.Order())-1])
	})
}

// A reserve: one of five kept for interactive callers even while none is
// waiting.
func TestLimiterReserve(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(5, slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 1}))
		var held []*slots.Slot
		for range 4 {
			s, err := l.TryAcquire()
			require.NoError(t, err)
			held = append(held, s)
		}
		_, err := l.TryAcquire()
		assert.ErrorIs(t, err, slots.ErrLimitReached, "the fifth is reserved")
		ctx, cancel := context.WithTimeout(batch, time.Minute)
		defer cancel()
		_, err = l.Acquire(ctx)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "batch may not take the reserve")

		s, err := l.Acquire(interactive)
		require.NoError(t, err)
		held = append(held, s)
		for _, s := range held {
			s.Release()
		}
	})
}

// Flow A queues 200, then flow B one: B is admitted within the next two
// grants.
func TestLimiterFlowsTakeTurns(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(1)
		r := testrig.New(t, l.Acquire)
		a := slots.WithFlow(context.Background(), "A")
		r.Add(a, "A")
		for range 200 {
			r.Add(a, "A")
		}
		r.Add(slots.WithFlow(context.Background(), "B"), "B")
		q := l.Queue()
		assert.Equal(t, []slots.FlowStat{{Flow: "A", Waiting: 200}, {Flow: "B", Waiting: 1}}, q.TopFlows)
		r.ReleaseOldest()
		r.ReleaseOldest()
		assert.Contains(t, r.Order()[1:3], "B")
		r.ReleaseAll()
	})
}

// Weights 3:1, both flows backlogged: over 400 grants the admitted ratio is
// within 5% of 3:1.
func TestLimiterFlowWeights(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(1)
		r := testrig.New(t, l.Acquire)
		r.CheckWeights(slots.WithFlowWeight(context.Background(), "A", 3), slots.WithFlowWeight(context.Background(), "B", 1))
		r.ReleaseAll()
	})
}

// A flow over its queue depth is turned away while other flows still queue.
func TestLimiterMaxQueuePerFlow(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(1, slots.WithMaxQueuePerFlow(2))
		r := testrig.New(t, l.Acquire)
		a := slots.WithFlow(context.Background(), "A")
		r.Add(a, "A")
		r.Add(a, "A")
		r.Add(a, "A")
		r.Add(a, "A") // a third waiter of A
		r.Add(slots.WithFlow(context.Background(), "B"), "B")
		require.Len(t, r.Errs(), 1)
		assert.ErrorIs(t, r.Errs()[0], slots.ErrQueueFull)
		assert.Equal(t, 3, l.Waiting())
		r.ReleaseAll()
		assert.Equal(t, []string{"A", "A", "B", "A"}, r.Order())
	})
}

func TestPriorityParse(t *testing.T) {
	for in, want := range map[string]slots.Priority{
		"interactive": slots.PriorityInteractive, " Batch ": slots.PriorityBatch,
		"": slots.PriorityDefault, "default": slots.PriorityDefault,
	} {
		got, err := slots.ParsePriority(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
		assert.Equal(t, want, slots.PriorityFrom(slots.WithPriority(context.Background(), got)))
	}
	_, err := slots.ParsePriority("urgent")
	assert.Error(t, err)
	assert.Equal(t, "interactive", slots.Priority(7).String(), "above the set counts as interactive")
	assert.Equal(t, slots.PriorityBatch, slots.PriorityFrom(slots.WithPriority(context.Background(), -9)))

	ctx := slots.WithFlowWeight(slots.WithPriority(context.Background(), slots.PriorityBatch), "org", 0)
	id, w := slots.FlowFrom(ctx)
	assert.Equal(t, "org", id)
	assert.Equal(t, 1, w, "a weight below 1 counts as 1")
	assert.Equal(t, slots.PriorityBatch, slots.PriorityFrom(ctx), "a flow keeps the priority")
	assert.Panics(t, func() { slots.WithShare(slots.PriorityBatch, slots.Share{Min: -1}) })
}

// Random classes, flows, cancellations and limit changes on a limiter with
// shares: the cap holds at every instant, every caller ends admitted or
// cancelled, and nothing is left.
func TestLimiterPriorityHammer(t *testing.T) {
	l := slots.NewLimiter(4,
		slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}),
		slots.WithShare(slots.PriorityInteractive, slots.Share{Reserved: 1}))
	hammerClasses(t, l.Acquire, l.SetLimit)
	assert.Zero(t, l.InFlight())
	assert.Zero(t, l.Waiting())
}

// hammerClasses runs 32 goroutines x 60 acquisitions with random classes,
// flows, weights and cancellations while one goroutine changes the limit
// between 2 and 6, counting holders on its own.
func hammerClasses(t *testing.T, acquire func(context.Context) (*slots.Slot, error), setLimit func(int)) {
	t.Helper()
	var mu sync.Mutex
	inFlight, maxLimit := 0, 4
	var admitted, failed int
	var wg sync.WaitGroup
	prios := []slots.Priority{slots.PriorityInteractive, slots.PriorityDefault, slots.PriorityBatch}
	for g := range 32 {
		wg.Go(func() {
			for i := range 60 {
				ctx := slots.WithPriority(context.Background(), prios[(g+i)%3])
				ctx = slots.WithFlowWeight(ctx, []string{"a", "b", "c", ""}[(g*7+i)%4], 1+i%3)
				var cancel context.CancelFunc = func() {}
				if i%4 == 0 {
					ctx, cancel = context.WithCancel(ctx)
					go cancel()
				}
				if g == 0 && i%10 == 0 {
					n := 2 + i%5
					mu.Lock()
					maxLimit = max(maxLimit, n)
					mu.Unlock()
					setLimit(n)
				}
				s, err := acquire(ctx)
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected error: %v", err)
					}
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				mu.Lock()
				inFlight++
				if inFlight > maxLimit {
					t.Errorf("in flight %d over every limit set (max %d)", inFlight, maxLimit)
				}
				admitted++
				mu.Unlock()
				runtime.Gosched() // hold it a moment
				mu.Lock()
				inFlight--
				mu.Unlock()
				s.Release()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 32*60, admitted+failed)
	assert.NotZero(t, admitted)
}

// The flow "" takes its weight like any other flow, in every class.
func TestLimiterDefaultFlowWeight(t *testing.T) {
	for _, p := range []slots.Priority{slots.PriorityDefault, slots.PriorityBatch} {
		testrig.Bubble(t, func(t *testing.T) {
			l := slots.NewLimiter(1)
			r := testrig.New(t, l.Acquire)
			base := slots.WithPriority(context.Background(), p)
			r.CheckWeights(slots.WithFlowWeight(base, "", 3), slots.WithFlowWeight(base, "B", 1))
			r.ReleaseAll()
		})
	}
}

// An idle class's Min is lent, and does not cut the guarantees of the
// classes below it: with interactive Min 2 on a limit of 2 and no
// interactive caller, batch's Min 1 still keeps batch moving under default
// load (one grant in two with equal holds).
func TestLimiterIdleMinDoesNotCutLowerShare(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(2,
			slots.WithShare(slots.PriorityInteractive, slots.Share{Min: 2}),
			slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
		r := testrig.New(t, l.Acquire)
		r.Add(context.Background(), "d")
		r.Add(context.Background(), "d")
		for range 20 {
			r.Add(batch, "b")
		}
		for range 40 {
			r.Add(context.Background(), "d")
		}
		for range 40 {
			r.ReleaseOldest()
		}
		n := 0
		for _, c := range r.Order()[2:] {
			if c == "b" {
				n++
			}
		}
		assert.Equal(t, 20, n, "batch grants out of 40")
		r.ReleaseAll()
	})
}
