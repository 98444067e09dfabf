package pacing_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
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

func newGate(t *testing.T, cfg pacing.Config) *pacing.Gate {
	t.Helper()
	g, err := pacing.NewGate("zai", cfg)
	require.NoError(t, err)
	return g
}

// acquireAsync starts an Acquire and delivers its outcome.
func acquireAsync(ctx context.Context, g *pacing.Gate, model string) chan result {
	c := make(chan result, 1)
	go func() {
		gt, err := g.Acquire(ctx, model)
		c <- result{gt, err}
	}()
	return c
}

type result struct {
	g   pacing.Grant
	err error
}

func TestGateModelCapWithinProviderCap(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 5, Models: map[string]pacing.ModelConfig{"glm-5.3": {MaxConcurrentRequests: 2}}})
		ctx := context.Background()
		var held []pacing.Grant
		for range 2 {
			gt, err := g.Acquire(ctx, "glm-5.3")
			require.NoError(t, err)
			held = append(held, gt)
		}
		third := acquireAsync(ctx, g, "glm-5.3")
		synctest.Wait()
		assert.Len(t, third, 0, "a third glm-5.3 request waits")
		for range 3 {
			gt, err := g.Acquire(ctx, "glm-4")
			require.NoError(t, err, "another model is admitted up to the provider cap")
			held = append(held, gt)
		}
		fourth := acquireAsync(ctx, g, "glm-4")
		synctest.Wait()
		assert.Len(t, fourth, 0, "the provider cap binds")

		body := slots.WrapBody(io.NopCloser(strings.NewReader("data: [DONE]\n\n")), held[0].Slot)
		require.NoError(t, body.Close()) // a glm-5.3 response body closes
		synctest.Wait()
		r := <-third
		require.NoError(t, r.err, "the glm-5.3 waiter, first in line, is admitted")
		assert.Len(t, fourth, 0)
		held[2].Slot.Release()
		r4 := <-fourth
		require.NoError(t, r4.err)
		for _, gt := range append(held[1:], r.g, r4.g) {
			gt.Slot.Release()
		}
	})
}

func TestGateSpacing(t *testing.T) {
	t.Run("600 rpm: grants at least 100 ms apart, in arrival order", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{RequestsPerMinute: 600})
			var results []chan result
			for range 5 {
				results = append(results, acquireAsync(context.Background(), g, "glm-5"))
				synctest.Wait()
			}
			var prev time.Time
			for i, c := range results {
				r := <-c
				require.NoError(t, r.err)
				at := r.g.Slot.AcquiredAt()
				if i > 0 {
					assert.Equal(t, 100*time.Millisecond, at.Sub(prev), "grant %d", i)
				}
				prev = at
				r.g.Slot.Release()
			}
		})
	})
	t.Run("an eligible sibling passes a model that is not due yet", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{Models: map[string]pacing.ModelConfig{"slow": {MinIntervalMS: 10_000}}})
			first, err := g.Acquire(context.Background(), "slow")
			require.NoError(t, err)
			start := time.Now()
			slow2 := acquireAsync(context.Background(), g, "slow")
			synctest.Wait()
			fast, err := g.Acquire(context.Background(), "fast")
			require.NoError(t, err, "not held back by the slow lane's waiter")
			assert.Equal(t, time.Duration(0), time.Since(start))
			r := <-slow2
			require.NoError(t, r.err)
			assert.Equal(t, 10*time.Second, r.g.Slot.AcquiredAt().Sub(first.Slot.AcquiredAt()))
			for _, s := range []*slots.Slot{first.Slot, fast.Slot, r.g.Slot} {
				s.Release()
			}
		})
	})
	t.Run("a cancelled waiter consumes no start", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{RequestsPerMinute: 600})
			first, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			t0 := first.Slot.AcquiredAt()
			ctx, cancel := context.WithCancel(context.Background())
			gone := acquireAsync(ctx, g, "m")
			time.Sleep(50 * time.Millisecond) // fake time
			cancel()
			assert.ErrorIs(t, (<-gone).err, context.Canceled)
			time.Sleep(10 * time.Millisecond)
			next, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			assert.Equal(t, 100*time.Millisecond, next.Slot.AcquiredAt().Sub(t0), "the next start is still the first one's +100 ms")
			first.Slot.Release()
			next.Slot.Release()
		})
	})
}

func TestGateQueueBounds(t *testing.T) {
	t.Run("depth 2: the newest is rejected at once", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueue: 2})
			held, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			a, b := acquireAsync(ctx, g, "m"), acquireAsync(ctx, g, "m")
			synctest.Wait()
			_, err = g.Acquire(context.Background(), "m")
			var le *slots.LimitError
			require.ErrorAs(t, err, &le)
			assert.ErrorIs(t, err, slots.ErrQueueFull)
			assert.Equal(t, 2, le.Queued)
			assert.GreaterOrEqual(t, le.RetryAfter, time.Second)
			cancel()
			<-a
			<-b
			held.Slot.Release()
		})
	})
	t.Run("queue age: rejected as expired, or let through with proceed", func(t *testing.T) {
		testrig.Bubble(t, func(t *testing.T) {
			for _, policy := range []string{pacing.Reject, pacing.Proceed} {
				g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, MaxQueueWaitMS: 1000, OnWaitTimeout: policy})
				held, _ := g.Acquire(context.Background(), "m")
				start := time.Now()
				gt, err := g.Acquire(context.Background(), "m")
				assert.Equal(t, time.Second, time.Since(start))
				if policy == pacing.Reject {
					assert.ErrorIs(t, err, slots.ErrWaitTimeout)
				} else {
					require.NoError(t, err)
					assert.True(t, gt.Slot.Bypassed())
					assert.Equal(t, uint64(1), g.Status().Bypassed, "a proceed is counted")
					gt.Slot.Release()
				}
				held.Slot.Release()
			}
		})
	})
}

func TestGateKeyPool(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{APIKeys: []pacing.KeyConfig{{ID: "k1", MaxConcurrentRequests: 1}, {ID: "k2", MaxConcurrentRequests: 1}, {ID: "k3", MaxConcurrentRequests: 2}}})
		keys := map[string]int{}
		var held []pacing.Grant
		for range 4 {
			gt, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			keys[gt.Key]++
			held = append(held, gt)
		}
		assert.Equal(t, map[string]int{"k1": 1, "k2": 1, "k3": 2}, keys, "each request is told its key")
		fifth := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		assert.Len(t, fifth, 0, "a fifth waits")
		held[0].Slot.Release()
		r := <-fifth
		require.NoError(t, r.err)
		assert.Equal(t, held[0].Key, r.g.Key, "it gets the key that came free")
		for _, gt := range append(held[1:], r.g) {
			gt.Slot.Release()
		}
	})
}

// TestGateHammer: random models, cancellations and releases; independent
// counters check the provider, model and key caps at every admission.
func TestGateHammer(t *testing.T) {
	cfg := pacing.Config{
		MaxConcurrentRequests: 6,
		APIKeys:               []pacing.KeyConfig{{ID: "a", MaxConcurrentRequests: 2}, {ID: "b", MaxConcurrentRequests: 3}},
		Models:                map[string]pacing.ModelConfig{"m1": {MaxConcurrentRequests: 2}, "m2": {MaxConcurrentRequests: 3}},
	}
	g := newGate(t, cfg)
	caps := map[string]int64{"provider": 5, "m1": 2, "m2": 3, "a": 2, "b": 3} // keys bind before the provider
	var mu sync.Mutex
	count := map[string]int64{}
	enter := func(names ...string) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range names {
			count[n]++
			if c, ok := caps[n]; ok && count[n] > c {
				t.Errorf("%s: %d in flight, over %d", n, count[n], c)
			}
		}
	}
	leave := func(names ...string) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range names {
			count[n]--
		}
	}
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 5))
			for range 200 {
				model := []string{"m1", "m2", "m3"}[rng.IntN(3)]
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(3) == 0 {
					go cancel()
				}
				gt, err := g.Acquire(ctx, model)
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("unexpected: %v", err)
					}
					failed.Add(1)
					continue
				}
				admitted.Add(1)
				enter("provider", model, gt.Key)
				leave("provider", model, gt.Key)
				gt.Slot.Release()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(16*200), admitted.Load()+failed.Load())
	assert.Positive(t, admitted.Load())
	st := g.Status()
	assert.Zero(t, st.InFlight)
	assert.Zero(t, st.Queued)
}

func TestGateReconfigure(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 1, APIKeys: []pacing.KeyConfig{{ID: "k1"}, {ID: "k2"}}})
		a, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		waiting := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		assert.Len(t, waiting, 0)

		require.Error(t, g.Reconfigure(pacing.Config{MaxConcurrentRequests: -1}), "a bad config changes nothing")
		require.NoError(t, g.Reconfigure(pacing.Config{MaxConcurrentRequests: 2, APIKeys: []pacing.KeyConfig{{ID: "k3"}}}))
		r := <-waiting
		require.NoError(t, r.err, "raising the cap admits the waiter at once")
		assert.Equal(t, "k3", r.g.Key, "the dropped keys get no new requests")

		require.NoError(t, g.Reconfigure(pacing.Config{MaxConcurrentRequests: 1}))
		st := g.Status()
		assert.Equal(t, 2, st.InFlight, "lowering the cap evicts nobody")
		_, err = g.Acquire(ctxWithTimeout(t, time.Second), "m")
		assert.Error(t, err, "and admits nobody until holders release")
		a.Slot.Release()
		r.g.Slot.Release()
		assert.Zero(t, g.Status().InFlight)
	})
}

func TestGateClose(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 1})
		held, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		waiting := acquireAsync(context.Background(), g, "m")
		synctest.Wait()
		g.Close()
		assert.ErrorIs(t, (<-waiting).err, pacing.ErrGateClosed)
		_, err = g.Acquire(context.Background(), "m")
		assert.ErrorIs(t, err, pacing.ErrGateClosed)
		assert.Equal(t, 1, g.Status().InFlight, "a holder keeps its slot")
		assert.True(t, held.Slot.Release())
		assert.Zero(t, g.Status().InFlight)
	})
}

func ctxWithTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestGateGivenBackTakesNoStart: a waiter whose context ends at the very
// instant it is granted gives the grant back, and its start with it.
func TestGateGivenBackTakesNoStart(t *testing.T) {
	for range 20 { // which of the grant and the deadline comes first varies
		testrig.Bubble(t, func(t *testing.T) {
			g := newGate(t, pacing.Config{RequestsPerMinute: 6}) // 10 s apart
			first, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			t0 := first.Slot.AcquiredAt()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // ends when its start comes
			defer cancel()
			if late, err := g.Acquire(ctx, "m"); err == nil {
				// Granted before the deadline this time: nothing given back.
				first.Slot.Release()
				late.Slot.Release()
				return
			}
			next, err := g.Acquire(context.Background(), "m")
			require.NoError(t, err)
			assert.Equal(t, 10*time.Second, next.Slot.AcquiredAt().Sub(t0), "the start given back is the next one's")
			first.Slot.Release()
			next.Slot.Release()
		})
	}
}

func TestGateFullQueueStillAdmitsWhatCanStart(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxQueue: 1, Models: map[string]pacing.ModelConfig{"a": {MaxConcurrentRequests: 1}}})
		a, _ := g.Acquire(context.Background(), "a")
		ctx, cancel := context.WithCancel(context.Background())
		queued := acquireAsync(ctx, g, "a")
		synctest.Wait()
		b, err := g.Acquire(context.Background(), "b")
		require.NoError(t, err, "a request whose lanes are free is not turned away by a full queue")
		_, err = g.Acquire(context.Background(), "a")
		assert.ErrorIs(t, err, slots.ErrQueueFull, "one that would have to queue is")
		cancel()
		<-queued
		a.Slot.Release()
		b.Slot.Release()
	})
}

func TestGateRetryAfterCoversTheNextStart(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		g := newGate(t, pacing.Config{MaxQueue: 1, MinIntervalMS: 2400})
		first, _ := g.Acquire(context.Background(), "m")
		ctx, cancel := context.WithCancel(context.Background())
		queued := acquireAsync(ctx, g, "m")
		synctest.Wait()
		_, err := g.Acquire(context.Background(), "m")
		var le *slots.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, 2400*time.Millisecond, le.RetryAfter, "2.4 s to the next start")
		status, ra := slots.HTTPStatus(err)
		assert.Equal(t, http.StatusTooManyRequests, status)
		assert.Equal(t, 3*time.Second, ra, "Retry-After rounds it up to whole seconds")
		cancel()
		<-queued
		first.Slot.Release()

		g2 := newGate(t, pacing.Config{MaxQueue: 1, Models: map[string]pacing.ModelConfig{"slow": {MinIntervalMS: 60_000}}})
		s1, _ := g2.Acquire(context.Background(), "slow")
		ctx2, cancel2 := context.WithCancel(context.Background())
		q2 := acquireAsync(ctx2, g2, "slow")
		synctest.Wait()
		_, err = g2.Acquire(context.Background(), "slow")
		require.ErrorAs(t, err, &le)
		assert.Equal(t, time.Minute, le.RetryAfter, "the model's next start counts too")
		cancel2()
		<-q2
		s1.Slot.Release()
	})
}

// After Close no waiter is granted, even by a release that comes at once:
// every waiter fails with ErrGateClosed.
func TestGateNoGrantAfterClose(t *testing.T) {
	for range 200 {
		g := newGate(t, pacing.Config{MaxConcurrentRequests: 1})
		held, err := g.Acquire(context.Background(), "m")
		require.NoError(t, err)
		waiting := acquireAsync(context.Background(), g, "m")
		require.Eventually(t, func() bool { return g.Status().Queued == 1 }, 5*time.Second, time.Microsecond)
		g.Close()
		held.Slot.Release()
		r := <-waiting
		require.ErrorIs(t, r.err, pacing.ErrGateClosed)
		assert.Zero(t, g.Status().InFlight)
	}
}
