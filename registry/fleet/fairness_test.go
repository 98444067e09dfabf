package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/registry/fleet/redisstore"
	"github.com/inflight-go/inflight/registry/fleet/redisstore/redistest"
	"github.com/inflight-go/inflight/slots"
)

// The tests in this file stand several gateway processes up as several
// Registries of one name on one Redis (each Registry is its own process to
// the fleet), and measure how the fleet's waiters fare against each other.
// Each logs its figures in one line per figure. Those that score waits do
// it in virtual time (testing/synctest), on a miniredis that runs the
// fleet's scripts with fwLatency each way: on a real clock the scores
// would be the scheduler's. The order of arrival is checked on a real
// redis-server, where it holds on any machine.

// fwLatency is the virtual Redis's latency each way, a loopback's order of
// magnitude.
const fwLatency = 100 * time.Microsecond

// fwFleet opens n Registries named name on srv, closed at the test's end.
func fwFleet(t testing.TB, srv redisServer, name string, n, limit int, opts ...Option) []*Registry[string] {
	t.Helper()
	rs := make([]*Registry[string], n)
	for i := range rs {
		rs[i] = New[string](redisstore.New(srv.Client(), name), limit, opts...)
		t.Cleanup(rs[i].Close)
	}
	return rs
}

// fwWaiting is the number of callers waiting in rs now.
func fwWaiting(rs ...*Registry[string]) int {
	n := 0
	for _, r := range rs {
		n += r.Stats().Waiting
	}
	return n
}

// fwUntil polls cond until it holds, failing the test after 5 s.
func fwUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	within(t, 5*time.Second, what, cond)
}

// within polls cond until it holds, failing the test after d.
func within(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(time.Millisecond) // polling a condition
	}
}

// fwPct returns the p-th percentile (0 < p <= 100) of ds, nearest rank.
func fwPct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// fwMs formats d in milliseconds, one decimal.
func fwMs(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }

// fwFlood starts n callers on r that acquire key with ctx, hold it for
// hold and release it, again and again until ctx ends. Each admission's
// wait is passed to record, if not nil.
func fwFlood(wg *sync.WaitGroup, ctx context.Context, r *Registry[string], key string, n int, hold time.Duration, record func(time.Duration)) {
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t0 := time.Now()
				s, err := r.Acquire(ctx, key)
				if err != nil {
					return // ctx ended
				}
				if record != nil {
					record(time.Since(t0))
				}
				time.Sleep(hold) // the request's work, inside the slot
				s.Release()
			}
		}()
	}
}

// fwAwaitFull waits until Redis counts limit holders on key, so that a
// request that follows arrives at a full key (and not at the slot its own
// caller has just released). It gives up after a second or when ctx ends,
// and reports whether the key was full.
func fwAwaitFull(ctx context.Context, r *Registry[string], key string, limit int) bool {
	deadline := time.Now().Add(time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if n, err := r.InFlight(ctx, key); err == nil && n >= limit {
			return true
		}
		time.Sleep(time.Millisecond) // polling a condition
	}
	return false
}

// fwGoal asserts ok, a fleet-wide waiting goal, failing with the figure
// measured and the message.
func fwGoal(t *testing.T, ok bool, figure string, msgAndArgs ...any) {
	t.Helper()
	assert.True(t, ok, append([]any{"%s: " + fmt.Sprint(msgAndArgs[0]), figure}, msgAndArgs[1:]...)...)
}

// A light tenant making one request at a time is not held back by a heavy
// tenant's backlog in other processes: within one class, flows take turns
// across the fleet, so the light request waits for about the next release
// at most (one hold time), not for the heavy backlog.
func TestFleetLightTenantWait(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		const (
			limit  = 4
			hold   = 20 * time.Millisecond
			heavyN = 16 // callers per heavy registry
			lightN = 100
			goal   = 50 * time.Millisecond // p99 beyond one hold
		)
		rs := fwFleet(t, srv, "fw-light", 3, limit)
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer stop()
		heavy := slots.WithFlow(ctx, "heavy")
		fwFlood(&wg, heavy, rs[0], "k", heavyN, hold, nil)
		fwFlood(&wg, heavy, rs[1], "k", heavyN, hold, nil)
		fwUntil(t, "the heavy tenant backs up", func() bool { return fwWaiting(rs[0], rs[1]) >= 2*heavyN-limit })

		light, cancel := context.WithTimeout(slots.WithFlow(context.Background(), "light"), 7*time.Second)
		defer cancel()
		var waits []time.Duration
		notFull := 0
		for range lightN {
			if !fwAwaitFull(light, rs[2], "k", limit) {
				notFull++
			}
			t0 := time.Now()
			s, err := rs[2].Acquire(light, "k")
			if err != nil {
				break // out of time: the waits so far are the figure
			}
			waits = append(waits, time.Since(t0))
			time.Sleep(hold)
			s.Release()
		}
		stop()
		wg.Wait()
		require.NotEmpty(t, waits, "the light tenant was never admitted")

		p50, p99 := fwPct(waits, 50), fwPct(waits, 99)
		t.Logf("light tenant: %d of %d requests admitted under a heavy flood (2 registries x %d callers, cap %d, hold %v)", len(waits), lightN, heavyN, limit, hold)
		t.Logf("light requests that found the key not full after 1s: %d", notFull)
		t.Logf("light p50 wait: %s (%s beyond one hold)", fwMs(p50), fwMs(p50-hold))
		t.Logf("light p99 wait: %s (%s beyond one hold; goal <= %s)", fwMs(p99), fwMs(p99-hold), fwMs(goal))
		t.Logf("light max wait: %s", fwMs(fwPct(waits, 100)))
		fwGoal(t, len(waits) == lightN && p99-hold <= goal,
			fmt.Sprintf("light p99 wait beyond one hold %s (goal %s), %d/%d admitted", fwMs(p99-hold), fwMs(goal), len(waits), lightN),
			"light p99 wait beyond one hold %v, over %v", p99-hold, goal)
	})
}

// Two backlogged flows weighted 1 and 3, each spread over every process,
// are admitted 1:3 across the fleet. The goal is read as a relative ±5% of
// each configured share: the weight-1 flow gets 25% ± 1.25 points, the
// weight-3 flow 75% ± 3.75 points (the first bound is the binding one).
func TestFleetWeightedFlows(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		const (
			limit   = 4
			hold    = 20 * time.Millisecond
			callers = 4 // per flow per registry: 12 per flow across 3
			window  = 3 * time.Second
			tol     = 0.05 // relative to the configured share
		)
		rs := fwFleet(t, srv, "fw-weights", 3, limit)
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer stop()
		var counting atomic.Bool
		var n1, n3 atomic.Int64
		w1 := slots.WithFlowWeight(ctx, "w1", 1)
		w3 := slots.WithFlowWeight(ctx, "w3", 3)
		for _, r := range rs {
			fwFlood(&wg, w1, r, "k", callers, hold, func(time.Duration) {
				if counting.Load() {
					n1.Add(1)
				}
			})
			fwFlood(&wg, w3, r, "k", callers, hold, func(time.Duration) {
				if counting.Load() {
					n3.Add(1)
				}
			})
		}
		fwUntil(t, "both flows back up", func() bool { return fwWaiting(rs...) >= 2*3*callers-limit })
		counting.Store(true)
		time.Sleep(window) // the measured window, with both flows backlogged
		counting.Store(false)
		stop()
		wg.Wait()

		a, b := n1.Load(), n3.Load()
		require.Positive(t, a+b)
		s1, s3 := float64(a)/float64(a+b), float64(b)/float64(a+b)
		t.Logf("weighted flows: %d admissions in %v (cap %d, hold %v, 12 callers per flow over 3 registries)", a+b, window, limit, hold)
		t.Logf("weight-1 flow share: %.1f%% (%d; goal 25%% ± %.2f points)", 100*s1, a, 100*0.25*tol)
		t.Logf("weight-3 flow share: %.1f%% (%d; goal 75%% ± %.2f points)", 100*s3, b, 100*0.75*tol)
		t.Logf("weight-3 : weight-1 admissions ratio: %.2f (goal 3)", float64(b)/float64(max(a, 1)))
		ok := fwAbs(s1-0.25) <= 0.25*tol && fwAbs(s3-0.75) <= 0.75*tol
		fwGoal(t, ok, fmt.Sprintf("weight-1 flow share %.1f%%, weight-3 %.1f%% (goal 25%%/75%%, ±5%% relative)", 100*s1, 100*s3),
			"flow shares %.3f / %.3f, want 0.25 / 0.75 within ±5%% relative", s1, s3)
	})
}

func fwAbs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// Within one class and one flow the fleet admits its waiters in the order
// they took their places in Redis's queue, whichever process each came
// through. Each caller starts once the one before it stands in that queue,
// so the order of arrival is known exactly, on any machine: one admission
// out of it is a fault. The callers come through the processes in a
// seeded random order, so that serving the processes in turn would not
// pass for arrival order; calls to Redis get seconds, so that a slow reply
// on a busy machine is not taken for an unavailable Redis (whose fallback,
// admission under the local caps alone, keeps no fleet order).
func TestFleetArrivalOrder(t *testing.T) {
	srv := redistest.Start(t)
	const (
		limit   = 1 // one admission at a time: the order is unambiguous
		hold    = 10 * time.Millisecond
		callers = 60 // over 3 registries, in a random order
	)
	patient := func() *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, PoolSize: 64})
		t.Cleanup(func() { c.Close() })
		return c
	}
	rs := make([]*Registry[string], 3)
	for i := range rs {
		rs[i] = New[string](redisstore.New(patient(), "fw-order"), limit, WithTimeout(5*time.Second))
		t.Cleanup(rs[i].Close)
	}
	queue := patient()
	// Saturate the key while the callers arrive.
	first, err := rs[0].TryAcquire("k")
	require.NoError(t, err)

	var admSeq atomic.Int64
	admitted := make([]int64, callers) // by arrival
	ctx, cancel := context.WithTimeout(slots.WithFlow(context.Background(), "one"), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	rng := rand.New(rand.NewPCG(3, 5))
	for i := range callers {
		r := rs[rng.IntN(len(rs))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := r.Acquire(ctx, "k")
			if err != nil {
				admitted[i] = -1
				errs <- err
				return
			}
			admitted[i] = admSeq.Add(1)
			time.Sleep(hold) // the request's work, inside the slot
			s.Release()
		}()
		fwUntil(t, "the caller stands in Redis's queue", func() bool {
			n, err := queue.ZCard(ctx, "inflight:{fw-order}:k#q").Result()
			return err == nil && n == int64(i+1)
		})
	}
	first.Release()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i, r := range rs {
		st := r.Stats()
		require.Zero(t, st.StoreErrors+st.Degraded, "registry %d: Redis failed a call, or an admission went without it", i)
	}

	inversions, late := 0, 0
	for i := range admitted {
		behind := false
		for j := i + 1; j < callers; j++ {
			if admitted[j] < admitted[i] {
				inversions++
				behind = true
			}
		}
		if behind {
			late++
		}
	}
	t.Logf("arrival order: %d callers over %d registries, cap %d, hold %v", callers, len(rs), limit, hold)
	t.Logf("arrival order inversions: %d of %d pairs; %d callers passed by a later one", inversions, callers*(callers-1)/2, late)
	assert.Zero(t, inversions, "admissions out of the queue's order")
}

// Under a batch flood from every process, interactive callers wait for
// about the next release (one hold time) at most: the class order holds
// across the fleet, not only within each process.
func TestFleetPriorityUnderBatchFlood(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		const (
			limit  = 5
			hold   = 20 * time.Millisecond
			batchN = 12 // batch callers per registry
			window = 3 * time.Second
			goal   = 50 * time.Millisecond // interactive p99 beyond one hold
		)
		rs := fwFleet(t, srv, "fw-priority", 3, limit)
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer stop()
		var mu sync.Mutex
		var counting atomic.Bool
		var batchWaits, interWaits []time.Duration
		recorder := func(into *[]time.Duration) func(time.Duration) {
			return func(d time.Duration) {
				if !counting.Load() {
					return
				}
				mu.Lock()
				*into = append(*into, d)
				mu.Unlock()
			}
		}
		batch := slots.WithPriority(ctx, slots.PriorityBatch)
		for _, r := range rs {
			fwFlood(&wg, batch, r, "k", batchN, hold, recorder(&batchWaits))
		}
		fwUntil(t, "the batch flood backs up", func() bool { return fwWaiting(rs...) >= len(rs)*batchN-limit })
		counting.Store(true)
		// One interactive caller per process, one request at a time, each
		// arriving at a full key.
		inter := slots.WithPriority(ctx, slots.PriorityInteractive)
		record := recorder(&interWaits)
		var notFull atomic.Int64
		for _, r := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for inter.Err() == nil {
					if !fwAwaitFull(inter, r, "k", limit) && counting.Load() {
						notFull.Add(1)
					}
					t0 := time.Now()
					s, err := r.Acquire(inter, "k")
					if err != nil {
						return // ctx ended
					}
					record(time.Since(t0))
					time.Sleep(hold)
					s.Release()
				}
			}()
		}
		time.Sleep(window) // the measured window
		counting.Store(false)
		stop()
		wg.Wait()

		mu.Lock()
		defer mu.Unlock()
		require.NotEmpty(t, interWaits)
		require.NotEmpty(t, batchWaits)
		ip95, ip99 := fwPct(interWaits, 95), fwPct(interWaits, 99)
		t.Logf("priority: %d interactive and %d batch admissions in %v (3 registries x %d batch callers + 1 interactive caller, cap %d, hold %v)",
			len(interWaits), len(batchWaits), window, batchN, limit, hold)
		t.Logf("interactive requests that found the key not full after 1s: %d", notFull.Load())
		t.Logf("interactive wait p50/p95/p99: %s / %s / %s (p99 beyond one hold %s; goal <= %s)",
			fwMs(fwPct(interWaits, 50)), fwMs(ip95), fwMs(ip99), fwMs(ip99-hold), fwMs(goal))
		t.Logf("batch wait p50/p95/p99: %s / %s / %s",
			fwMs(fwPct(batchWaits, 50)), fwMs(fwPct(batchWaits, 95)), fwMs(fwPct(batchWaits, 99)))
		fwGoal(t, ip99-hold <= goal, fmt.Sprintf("interactive p99 wait beyond one hold %s (goal %s)", fwMs(ip99-hold), fwMs(goal)),
			"interactive p99 wait beyond one hold %v, over %v", ip99-hold, goal)
	})
}

// Weighted turns, exactly, on a real redis-server: with one slot held,
// waiters of a flow of weight 3 (A) and one of weight 1 (B) queue
// alternately, A1 B1 A2 B2 ..., each once the one before it stands in
// Redis's queue; the holder then lets go, and each waiter releases as soon
// as it is admitted. Start tags (A: 0, 1/3, 2/3, 1, ...; B: 0, 1, 2, ...),
// then arrival, give the one order (pgstore's TestWeightedTurns asks the
// same of PostgreSQL).
func TestFleetWeightedTurns(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	queued := func() int64 { return c.ZCard(context.Background(), "inflight:{turns}:k#q").Val() }
	a, b := New[string](redisstore.New(c, "turns"), 1), New[string](redisstore.New(c, "turns"), 1)
	t.Cleanup(a.Close)
	t.Cleanup(b.Close)
	held, err := a.TryAcquire("k")
	require.NoError(t, err)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	wait := func(r *Registry[string], flow string, weight int, name string) {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(slots.WithFlowWeight(context.Background(), flow, weight), 30*time.Second)
			defer cancel()
			s, err := r.Acquire(ctx, "k")
			if !assert.NoError(t, err, name) {
				return
			}
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			s.Release()
		})
	}
	for i := int64(1); i <= 6; i++ {
		wait(a, "A", 3, fmt.Sprint("A", i))
		fwUntil(t, "queued", func() bool { return queued() == 2*i-1 })
		wait(b, "B", 1, fmt.Sprint("B", i))
		fwUntil(t, "queued", func() bool { return queued() == 2*i })
	}
	held.Release()
	wg.Wait()
	assert.Equal(t, []string{"A1", "B1", "A2", "A3", "B2", "A4", "A5", "A6", "B3", "B4", "B5", "B6"}, order)
}
