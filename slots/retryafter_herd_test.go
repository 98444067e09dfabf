package slots_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// Callers whose waits time out together are told to come back as the
// slots free, two by two, not all at one time. Two holders of 1 s (the
// mean hold) started at 4 s; six callers came at 4 s and waited 500 ms.
// The first two are told to come when the holders end (5 s), less a lead
// of half their wait, so that they are queued then: 250 ms. The next two
// a hold later, and so on. (All six were told 2.25 s: each caller that
// timed out counted those still queued, who were to be told after it.)
func TestRetryAfterSpreadsWaitsThatEndTogether(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(2, slots.WithMaxWait(500*time.Millisecond))
		for range 4 { // a mean hold of 1 s
			a, err := l.TryAcquire()
			require.NoError(t, err)
			b, err := l.TryAcquire()
			require.NoError(t, err)
			time.Sleep(time.Second)
			a.Release()
			b.Release()
		}
		a, err := l.TryAcquire()
		require.NoError(t, err)
		defer a.Release()
		b, err := l.TryAcquire()
		require.NoError(t, err)
		defer b.Release()
		var mu sync.Mutex
		var told []time.Duration
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() {
				_, err := l.Acquire(context.Background())
				var le *slots.LimitError
				if assert.True(t, errors.As(err, &le)) && assert.ErrorIs(t, err, slots.ErrWaitTimeout) {
					mu.Lock()
					told = append(told, le.RetryAfter)
					mu.Unlock()
				}
			})
		}
		synctest.Wait()
		wg.Wait()
		slices.Sort(told)
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{250 * ms, 250 * ms, 1250 * ms, 1250 * ms, 2250 * ms, 2250 * ms}, told)
	})
}

// timedOutBehind returns the Retry-After told to a caller of class p on l,
// all of whose units are held, whose wait of 1 s times out while
// interactive callers of the given units, who came 500 ms after it, wait
// too. In a bubble.
func timedOutBehind(t *testing.T, l *slots.Limiter, p slots.Priority, queued ...int) time.Duration {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	told := make(chan time.Duration, 1)
	go func() {
		_, err := l.Acquire(slots.WithPriority(ctx, p))
		var le *slots.LimitError
		if assert.True(t, errors.As(err, &le)) {
			told <- le.RetryAfter
		}
	}()
	time.Sleep(500 * time.Millisecond)
	for _, n := range queued {
		go l.AcquireN(slots.WithPriority(ctx, slots.PriorityInteractive), n)
	}
	synctest.Wait()
	require.Equal(t, 1+len(queued), l.Waiting())
	return <-told
}

// A caller that timed out counts the waiters of higher classes, which
// came after it but are served first, ahead of it: a batch caller behind
// two interactive ones on one slot of 1 s holds is told to come back for
// the third turn, not the next (where it would queue behind them and time
// out again). An interactive caller in its place is told the next turn.
func TestRetryAfterOfATimeoutBehindHigherClasses(t *testing.T) {
	for _, tc := range []struct {
		p    slots.Priority
		want time.Duration
	}{{slots.PriorityBatch, 1500 * time.Millisecond}, {slots.PriorityInteractive, time.Millisecond}} {
		t.Run(tc.p.String(), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				l := slots.NewLimiter(1, slots.WithMaxWait(time.Second))
				testrig.WarmHolds(t, time.Second, l.TryAcquire)
				held, err := l.TryAcquire()
				require.NoError(t, err)
				defer held.Release()
				assert.Equal(t, tc.want, timedOutBehind(t, l, tc.p, 1, 1))
			})
		})
	}
}

// The waiters of higher classes count by their units: a batch caller behind
// one interactive caller of 2 units on a limit of 2 is told what it is
// told behind two of one unit. With a share of the limit owed to its class,
// it counts none of them: it is served before them.
func TestRetryAfterOfATimeoutBehindHigherUnits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		share  bool
		queued []int // the interactive callers queued ahead, by units
		want   time.Duration
	}{
		{"two of one unit", false, []int{1, 1}, 750 * time.Millisecond},
		{"one of two units", false, []int{2}, 750 * time.Millisecond},
		{"owed its share", true, []int{1, 1}, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				opts := []slots.Option{slots.WithMaxWait(time.Second)}
				if tc.share {
					opts = append(opts, slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
				}
				l := slots.NewLimiter(2, opts...)
				testrig.WarmHolds(t, time.Second, func() (*slots.Slot, error) { return l.TryAcquireN(2) })
				held, err := l.TryAcquireN(2)
				require.NoError(t, err)
				defer held.Release()
				assert.Equal(t, tc.want, timedOutBehind(t, l, slots.PriorityBatch, tc.queued...))
			})
		})
	}
}
