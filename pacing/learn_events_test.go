package pacing_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/pacing"
	"github.com/inflight-go/inflight/slots"
)

// hookLog records what an OnLimitChange hook was called with, as each
// call returns, and whether a call began while another was running.
type hookLog struct {
	running atomic.Int32
	overlap atomic.Bool

	mu  sync.Mutex // protects got
	got []pacing.LimitChange
}

func (h *hookLog) enter() {
	if h.running.Add(1) > 1 {
		h.overlap.Store(true)
	}
}

func (h *hookLog) leave(c pacing.LimitChange) {
	h.mu.Lock()
	h.got = append(h.got, c)
	h.mu.Unlock()
	h.running.Add(-1)
}

func (h *hookLog) changes() []pacing.LimitChange {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]pacing.LimitChange(nil), h.got...)
}

func seqs(cs []pacing.LimitChange) []uint64 {
	var out []uint64
	for _, c := range cs {
		out = append(out, c.Seq)
	}
	return out
}

// lowered is the config of these tests with a lower ceiling: a change of
// the learned cap that a Reconfigure makes.
func lowered(ceiling int) pacing.Config {
	return pacing.Config{Adaptive: &pacing.AdaptiveConfig{Initial: 4, Max: ceiling, RetestMS: 60_000}}
}

func TestLimitChangesAreDeliveredInOrder(t *testing.T) {
	t.Run("a change made while the hook runs is delivered after it returns, and its maker does not wait", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, lowered(0))
			var h hookLog
			var first atomic.Bool
			unblock := make(chan struct{})
			g.OnLimitChange(func(c pacing.LimitChange) {
				h.enter()
				if first.CompareAndSwap(false, true) {
					<-unblock
				}
				h.leave(c)
			})
			held := acquireN(t, g, 5)
			go g.Report(held[4], refused) // the ceiling falls to 4; the hook holds its delivery
			synctest.Wait()
			require.NoError(t, g.Reconfigure(lowered(3)), "returns while the hook is held")
			assert.Empty(t, h.changes(), "the second change waits for the first call to return")
			close(unblock)
			synctest.Wait()
			got := h.changes()
			require.Len(t, got, 2)
			assert.Equal(t, 4, got[0].Ceiling, "the refusal's change first")
			assert.Equal(t, 3, got[1].Cap, "the Reconfigure's second")
			assert.False(t, h.overlap.Load(), "one call at a time")
			assert.Equal(t, []uint64{2, 3}, seqs(got), "numbered as made, after the initial cap's 1")
			g.Close()
		})
	})
	t.Run("a change the hook makes itself is delivered after the call that made it", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, lowered(0))
			var h hookLog
			var first atomic.Bool
			g.OnLimitChange(func(c pacing.LimitChange) {
				h.enter()
				if first.CompareAndSwap(false, true) {
					assert.NoError(t, g.Reconfigure(lowered(3)), "the Gate is not locked")
				}
				h.leave(c)
			})
			held := acquireN(t, g, 5)
			g.Report(held[4], refused)
			got := h.changes()
			require.Len(t, got, 2, "both delivered before Report returned")
			assert.Equal(t, 4, got[0].Ceiling)
			assert.Equal(t, 3, got[1].Cap)
			assert.False(t, h.overlap.Load(), "not called within itself")
			assert.Equal(t, []uint64{2, 3}, seqs(got))
			g.Close()
		})
	})
	t.Run("a hook that panicked once gets the later changes", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, lowered(0))
			var got []pacing.LimitChange
			g.OnLimitChange(func(c pacing.LimitChange) {
				if c.Seq == 2 {
					panic("the hook failed")
				}
				got = append(got, c)
			})
			held := acquireN(t, g, 5)
			assert.Panics(t, func() { g.Report(held[4], refused) }, "the panic reaches the caller")
			require.NoError(t, g.Reconfigure(lowered(3)))
			assert.Equal(t, []uint64{3}, seqs(got))
			g.Close()
		})
	})
	t.Run("changes made with no hook set are numbered but not delivered", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, lowered(0))
			held := acquireN(t, g, 5)
			g.Report(held[4], refused) // change 2, with no hook
			var got []pacing.LimitChange
			g.OnLimitChange(func(c pacing.LimitChange) { got = append(got, c) })
			require.NoError(t, g.Reconfigure(lowered(3)))
			assert.Equal(t, []uint64{3}, seqs(got), "a gap tells the reader a change was missed")
			g.OnLimitChange(nil)
			require.NoError(t, g.Reconfigure(lowered(2)))
			assert.Len(t, got, 1, "none after the hook is removed")
			g.Close()
		})
	})
}

// Many callers acquire, report random answers and release while the
// learned cap moves and the config changes: the hook is called one call at
// a time, with every change, numbered one after the other, and each
// change starts where the one before it ended.
func TestLimitChangesHammer(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		cfg := func(ceiling int) pacing.Config {
			return pacing.Config{MaxQueue: 1000, Adaptive: &pacing.AdaptiveConfig{Initial: 3, Max: ceiling, RetestMS: 5}}
		}
		g := newGate(t, cfg(12))
		var h hookLog
		g.OnLimitChange(func(c pacing.LimitChange) {
			h.enter()
			runtime.Gosched() // a hook takes a while: time for another to begin
			h.leave(c)
		})
		kinds := []pacing.Kind{pacing.Admitted, pacing.Admitted, pacing.Admitted, pacing.Concurrency, pacing.Overload, pacing.Other}
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), 2))
				for i := range 200 {
					if w == 0 && i%20 == 0 {
						assert.NoError(t, g.Reconfigure(cfg(8+rng.IntN(8))))
					}
					gt, err := g.Acquire(context.Background(), "m")
					if !assert.NoError(t, err) {
						return
					}
					time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond) // the upstream's answer takes a while
					g.Report(gt, pacing.Verdict{Kind: kinds[rng.IntN(len(kinds))]})
					gt.Slot.Release()
				}
			})
		}
		wg.Wait()
		g.Close()
		synctest.Wait() // a timer's delivery under way ends

		got := h.changes()
		require.Greater(t, len(got), 50, "the cap moved")
		assert.False(t, h.overlap.Load(), "one call at a time")
		assert.Equal(t, g.Learned().Changes, got[len(got)-1].Seq, "every change delivered, the last one last")
		for i, c := range got {
			if !assert.Equal(t, uint64(i+2), c.Seq, "in the order made, after the initial cap's 1") {
				break
			}
			if i > 0 && !assert.Equal(t, [2]int{got[i-1].Cap, got[i-1].Ceiling}, [2]int{c.OldCap, c.OldCeiling},
				"change %d starts where change %d ended", c.Seq, got[i-1].Seq) {
				break
			}
		}
	})
}

// TestLimitChangesWhileTheHookIsStuck: the changes queued for a hook that
// does not return are bounded; the oldest go first, and the numbers of
// those delivered show the gap.
func TestLimitChangesWhileTheHookIsStuck(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, lowered(0))
		var h hookLog
		var first atomic.Bool
		unblock := make(chan struct{})
		g.OnLimitChange(func(c pacing.LimitChange) {
			if first.CompareAndSwap(false, true) {
				<-unblock
			}
			h.enter()
			h.leave(c)
		})
		held := acquireN(t, g, 5)
		go g.Report(held[4], refused) // its delivery is held by the hook
		synctest.Wait()
		// Each turn stops learning and starts it again at its initial cap
		// of 4, under a ceiling of 2 or 3: a change each time.
		const made = 3 * pacing.MaxPendingChanges
		for i := range made {
			require.NoError(t, g.Reconfigure(pacing.Config{}))
			require.NoError(t, g.Reconfigure(lowered(2+i%2)))
		}
		close(unblock)
		synctest.Wait()
		got := h.changes()
		require.Equal(t, pacing.MaxPendingChanges+1, len(got), "the stuck call's change, then as many as the bound keeps")
		for i := 1; i < len(got); i++ {
			assert.Greater(t, got[i].Seq, got[i-1].Seq, "in order")
		}
		assert.Greater(t, got[1].Seq-got[0].Seq, uint64(1), "the oldest queued were dropped: a gap")
		assert.Equal(t, g.Learned().Cap, got[len(got)-1].Cap, "the newest are kept")
		g.Close()
	})
}

// TestAHookThatPanicsOnATimer: a change that a Gate's own timer makes (here
// a probe taken as admitted once its gap has passed) is delivered on the
// timer's goroutine, where a panic of the hook would end the process: it
// is logged instead, and later changes are delivered.
func TestAHookThatPanicsOnATimer(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		var logs strings.Builder
		var mu sync.Mutex
		log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return logs.Write(p)
		}), nil))
		g, err := pacing.NewGate("zai", lowered(0), slots.WithLogger(log))
		require.NoError(t, err)
		var calls atomic.Int32
		g.OnLimitChange(func(c pacing.LimitChange) {
			if calls.Add(1) == 1 {
				panic("hook failed")
			}
		})
		held := acquireN(t, g, 5)   // the fifth is a probe
		time.Sleep(3 * time.Second) // past its gap: the timer takes it as admitted
		synctest.Wait()
		require.Equal(t, int32(1), calls.Load(), "the timer's change reached the hook")
		mu.Lock()
		assert.Contains(t, logs.String(), "hook failed")
		mu.Unlock()
		require.NoError(t, g.Reconfigure(lowered(3)))
		assert.Equal(t, int32(2), calls.Load(), "later changes are delivered")
		for _, h := range held {
			h.Slot.Release()
		}
		g.Close()
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
