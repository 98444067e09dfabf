package slots_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
// mean hold) started together; six callers came then and waited 500 ms.
// The first two are told to come when the holders end (1 s on), less a lead
// of half their wait, so that they are queued then: 250 ms. The next two
// a hold later, and so on. (All six were told 2.25 s: each caller that
// timed out counted those still queued, who were to be told after it.)
func TestRetryAfterSpreadsWaitsThatEndTogether(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(2, slots.WithMaxWait(500*time.Millisecond))
		defer holdBoth(t, l)()
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

// holdBoth makes the mean hold of l, a Limiter of 2, 1 s (four holds of
// both slots), then holds both slots, started together, until the returned
// function frees them. In a bubble.
func holdBoth(t *testing.T, l *slots.Limiter) (free func()) {
	t.Helper()
	testrig.WarmHolds(t, time.Second, func() (*slots.Slot, error) { return l.TryAcquireN(2) })
	a, err := l.TryAcquire()
	require.NoError(t, err)
	b, err := l.TryAcquire()
	require.NoError(t, err)
	return func() { a.Release(); b.Release() }
}

// backAt returns a function that acquires from l under a context, which
// must be refused, and returns when the caller is told to come back, from
// the time backAt was called. In a bubble.
func backAt(t *testing.T, l *slots.Limiter) func(context.Context) time.Duration {
	start := time.Now()
	return func(ctx context.Context) time.Duration {
		_, err := l.Acquire(ctx)
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		return time.Since(start) + le.RetryAfter
	}
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

// Callers refused for a full queue count the callers queued ahead of them;
// when those time out, they are told to come back behind the returns told
// before: each return has a slot freeing for it, two a round on two slots.
// Two holders of 1 s (the mean hold) started together, four callers queued
// with a wait of 500 ms, six more refused. (The four that timed out were
// told the fourth and fifth rounds, already told to four of the six: four
// callers for the two slots of each, of whom two timed out again.)
func TestRetryAfterOfTimeoutsBehindThoseToldBefore(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(2, slots.WithMaxQueue(4), slots.WithMaxWait(500*time.Millisecond))
		defer holdBoth(t, l)()
		start := time.Now()
		var mu sync.Mutex
		// The callers that come back for each round of the holds, the
		// releases at 1 s, 2 s, ... from start.
		rounds := map[time.Duration]int{}
		note := func(err error) (told time.Duration) {
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			mu.Lock()
			defer mu.Unlock()
			rounds[(time.Since(start)+le.RetryAfter+time.Second-1)/time.Second]++
			return le.RetryAfter
		}
		var timedOut []time.Duration
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				_, err := l.Acquire(context.Background())
				assert.ErrorIs(t, err, slots.ErrWaitTimeout)
				told := note(err)
				mu.Lock()
				timedOut = append(timedOut, told)
				mu.Unlock()
			})
		}
		synctest.Wait()
		var queueFull []time.Duration
		for range 6 {
			_, err := l.Acquire(context.Background())
			require.ErrorIs(t, err, slots.ErrQueueFull)
			queueFull = append(queueFull, note(err))
		}
		wg.Wait()
		slices.Sort(timedOut)
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{3 * time.Second, 3 * time.Second, 4 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}, queueFull,
			"two a round from the third (four queued ahead)")
		assert.Equal(t, []time.Duration{5250 * ms, 5250 * ms, 6250 * ms, 6250 * ms}, timedOut,
			"behind the six, at 500 ms: the sixth and seventh rounds, a lead of 250 ms (half the wait) before")
		for r, n := range rounds {
			assert.LessOrEqual(t, n, 2, "callers told to come for the release of round %d, of two slots", r)
		}
	})
}

// Before any hold has ended, a caller that times out is told to come back
// a lead before its room frees, as later ones are: half its wait, within
// half a turn of the hold assumed until one is known (1 s). It was told
// to come as the room frees, and timed out again behind the queue.
func TestRetryAfterOfATimeoutBeforeAnyHoldEnded(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(1, slots.WithMaxWait(400*time.Millisecond))
		held, err := l.TryAcquire()
		require.NoError(t, err)
		defer held.Release()
		_, err = l.Acquire(context.Background())
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		require.ErrorIs(t, err, slots.ErrWaitTimeout)
		assert.Equal(t, 400*time.Millisecond, le.RetryAfter, "the holder ends at 1 s; at 400 ms, 200 ms before")
	})
}

// An interactive caller that timed out is told to come back before a batch
// caller refused for a full queue after it came: the batch caller counted
// it among the queued, but goes behind it, not the other way round. On one
// slot of 1 s holds, with a queue of two and a wait of 1 s: the interactive
// caller is back at 1.5 s (half its wait before the holder's next end at
// 2 s), the batch one at 3 s. (Booked by the count of units freed without
// the classes, the interactive caller was told to come at 3.5 s.)
func TestRetryAfterOfATimeoutBeforeLowerClassesToldAfterIt(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(1, slots.WithMaxQueue(2), slots.WithMaxWait(time.Second))
		testrig.WarmHolds(t, time.Second, l.TryAcquire)
		held, err := l.TryAcquire()
		require.NoError(t, err)
		defer held.Release()
		back := backAt(t, l)
		interactive := make(chan time.Duration, 1)
		go func() { interactive <- back(slots.WithPriority(context.Background(), slots.PriorityInteractive)) }()
		time.Sleep(100 * time.Millisecond)
		queued := make(chan time.Duration, 1)
		go func() { queued <- back(slots.WithPriority(context.Background(), slots.PriorityBatch)) }()
		synctest.Wait()
		batch := back(slots.WithPriority(context.Background(), slots.PriorityBatch)) // the queue is full
		assert.Equal(t, 3*time.Second, batch)
		assert.Equal(t, 1500*time.Millisecond, <-interactive)
		<-queued // times out at 1.1 s
	})
}

// A caller that comes back as told while the holders run past the mean is
// told the same again, not later each time: its own return, due as it
// comes, is no longer ahead of it, also when the coarse clock reads its
// return as a few milliseconds ahead (here: it comes 5 ms early). (Booked
// by the count of units freed, which does not move while nothing frees,
// it was told 1 s, 1.5 s, 2 s...)
func TestRetryAfterOfACallerBackPastTheMean(t *testing.T) {
	for _, early := range []time.Duration{0, 5 * time.Millisecond} {
		t.Run(fmt.Sprint(early, " early"), func(t *testing.T) {
			testrig.Bubble(t, func(t *testing.T) {
				l := slots.NewLimiter(2)
				defer holdBoth(t, l)()
				var told []time.Duration
				for range 10 { // the holders run on
					_, err := l.TryAcquire()
					var le *slots.LimitError
					require.ErrorAs(t, err, &le)
					told = append(told, le.RetryAfter)
					time.Sleep(le.RetryAfter - min(early, le.RetryAfter))
				}
				t.Logf("told: %v", told)
				for _, d := range told[3:] {
					assert.Equal(t, 500*time.Millisecond, d, "a turn of the two slots each time")
				}
			})
		})
	}
}

// A caller whose class is owed its share and that timed out goes first:
// it counts the returns told, but is not placed behind the last return
// still to come of the higher classes. On two slots of 1 s holds, with a
// share of one for batch callers: a batch caller queued and timed out at
// 1 s, while four interactive callers were refused for a full queue (told
// 2 s, 2 s, 3 s and 3 s). It comes for the round at 3 s, a lead of 250 ms
// before, where its share serves it first. (Placed behind the interactive
// returns, it was told to come at 3.75 s.)
func TestRetryAfterOfATimeoutOwedItsShare(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(2, slots.WithMaxQueue(2), slots.WithMaxWait(time.Second),
			slots.WithShare(slots.PriorityBatch, slots.Share{Min: 1}))
		defer holdBoth(t, l)()
		back := backAt(t, l)
		interactive := slots.WithPriority(context.Background(), slots.PriorityInteractive)
		batch := make(chan time.Duration, 1)
		go func() { batch <- back(slots.WithPriority(context.Background(), slots.PriorityBatch)) }()
		time.Sleep(100 * time.Millisecond)
		queued := make(chan time.Duration, 1)
		go func() { queued <- back(interactive) }()
		synctest.Wait()
		var told []time.Duration
		for range 4 {
			told = append(told, back(interactive))
		}
		assert.Equal(t, []time.Duration{2 * time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}, told)
		assert.Equal(t, 2750*time.Millisecond, <-batch, "the round at 3 s, less a lead of a quarter of a hold")
		<-queued
	})
}

// Callers whose context's deadline (a server's) passes while they wait are
// told when their turn was expected, as if their wait had timed out:
// spread one turn apart, not all a fixed second. Their error is still the
// context's, and HTTPStatus answers it 503 with that time; a caller that
// went away (its context cancelled) is told nothing.
func TestRetryAfterOfWaitsADeadlineEnded(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		l := slots.NewLimiter(2)
		defer holdBoth(t, l)()
		told := testrig.DeadlineRetries(t, 6, 500*time.Millisecond, func(ctx context.Context) error {
			_, err := l.Acquire(ctx)
			assert.False(t, errors.As(err, new(*slots.LimitError)), "the context's error, not a refusal")
			var later interface{ RetryAfter() time.Duration }
			if errors.As(err, &later) {
				status, retryAfter := slots.HTTPStatus(err)
				assert.Equal(t, http.StatusServiceUnavailable, status)
				assert.Equal(t, (later.RetryAfter() + time.Second - 1).Truncate(time.Second), retryAfter)
			}
			return err
		})
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{500 * ms, 500 * ms, 1500 * ms, 1500 * ms, 2500 * ms, 2500 * ms}, told)
		assert.Equal(t, uint64(6), l.Stats().Canceled, "counted as calls whose context ended")

		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := l.Acquire(ctx)
		require.ErrorIs(t, err, context.Canceled)
		assert.False(t, errors.As(err, new(interface{ RetryAfter() time.Duration })), "a caller gone is told nothing")
	})
}
