package fleet

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/inflight-go/inflight/internal/testrig"
	"github.com/inflight-go/inflight/slots"
)

// fleetSaturated is what clients that honour a saturated fleet key's
// Retry-After saw.
type fleetSaturated struct {
	requests, gaveUp                 int
	firstRefused, firstRetryAdmitted int
	waitingMoments, slotFreeMoments  int
	told                             []time.Duration // every Retry-After told
}

// runFleetSaturated is the saturated scenario of slots'
// TestRetryAfterSpreadsReturns on a fleet key: 12 clients, 6 on each of two
// processes, each sending 4 requests of a 1 s turn (give or take 10%, from
// seed) one after another, on a key of 2 slots, with a queue of 4 and a
// 500 ms wait in each process; a refused request is sent again after its
// RetryAfter, at most 5 times. Every 10 ms it notes whether some client is
// waiting out a Retry-After, and whether a slot of the key is free then. On
// a virtual Redis, in virtual time.
func runFleetSaturated(t *testing.T, seed uint64) fleetSaturated {
	var out fleetSaturated
	rng := rand.New(rand.NewPCG(seed, 1))
	var rngMu sync.Mutex
	turn := func() time.Duration {
		rngMu.Lock()
		defer rngMu.Unlock()
		return time.Duration((0.9 + 0.2*rng.Float64()) * float64(time.Second))
	}
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		rs := fwFleet(t, srv, "saturated", 2, 2, WithLogger(quiet()),
			WithLocalOptions(slots.WithMaxQueue(4), slots.WithMaxWait(500*time.Millisecond)))
		var mu sync.Mutex
		var sleeping atomic.Int32
		done := make(chan struct{})
		var wg sync.WaitGroup
		for c := range 12 {
			r := rs[c%2]
			wg.Go(func() {
				for range 4 {
					refusals := 0
					for {
						s, err := r.Acquire(context.Background(), "k")
						mu.Lock()
						if refusals == 1 && err == nil {
							out.firstRetryAdmitted++
						}
						if err != nil && refusals == 0 {
							out.firstRefused++
						}
						mu.Unlock()
						if err == nil {
							time.Sleep(turn())
							s.Release()
							break
						}
						var le *slots.LimitError
						if !errors.As(err, &le) {
							t.Errorf("not a refusal: %v", err)
							return
						}
						mu.Lock()
						out.told = append(out.told, le.RetryAfter)
						mu.Unlock()
						refusals++
						if refusals > 5 {
							mu.Lock()
							out.gaveUp++
							mu.Unlock()
							break
						}
						sleeping.Add(1)
						time.Sleep(le.RetryAfter)
						sleeping.Add(-1)
					}
					mu.Lock()
					out.requests++
					mu.Unlock()
				}
			})
		}
		go func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(10 * time.Millisecond):
				}
				if sleeping.Load() > 0 {
					held := rs[0].Local().InFlight("k") + rs[1].Local().InFlight("k")
					mu.Lock()
					out.waitingMoments++
					if held < 2 {
						out.slotFreeMoments++
					}
					mu.Unlock()
				}
			}
		}()
		wg.Wait()
		close(done)
	})
	return out
}

// TestFleetRetryAfterFollowsTheKey: clients that honour a saturated fleet
// key's Retry-After, over five runs, come back as its slots free. With the
// key's own holds and the returns spread (three runs of the five): 43-48%
// of first retries admitted, 2-3 of 240 requests given up, a slot free in
// 4.7-6.1% of the moments clients waited. Before, with one estimate for the
// whole Registry and callers refused together told the same time: 33-41%,
// 5-11 and 7.5-8.6%. The goal of 80% is not met here either, for
// the reason slots' TestRetryAfterSpreadsReturns gives.
func TestFleetRetryAfterFollowsTheKey(t *testing.T) {
	if testing.Short() {
		t.Skip("five virtual runs of some 20 s")
	}
	var sum fleetSaturated
	for seed := range uint64(5) {
		r := runFleetSaturated(t, seed)
		assert.Equal(t, 48, r.requests)
		sum.requests += r.requests
		sum.gaveUp += r.gaveUp
		sum.firstRefused += r.firstRefused
		sum.firstRetryAdmitted += r.firstRetryAdmitted
		sum.waitingMoments += r.waitingMoments
		sum.slotFreeMoments += r.slotFreeMoments
		sum.told = append(sum.told, r.told...)
	}
	first := float64(sum.firstRetryAdmitted) / float64(max(sum.firstRefused, 1))
	free := float64(sum.slotFreeMoments) / float64(max(sum.waitingMoments, 1))
	var told time.Duration
	for _, d := range sum.told {
		told += d
	}
	t.Logf("%d requests: %d refused at first, %d of them admitted at their first retry (%.0f%%); %d gave up; a slot free in %.1f%% of %d moments clients waited; mean Retry-After %v of %d",
		sum.requests, sum.firstRefused, sum.firstRetryAdmitted, 100*first, sum.gaveUp, 100*free, sum.waitingMoments,
		(told / time.Duration(max(len(sum.told), 1))).Round(time.Millisecond), len(sum.told))
	assert.GreaterOrEqual(t, first, 0.40, "first retries admitted")
	assert.LessOrEqual(t, sum.gaveUp, sum.requests/48, "requests given up")
	assert.LessOrEqual(t, free, 0.2, "moments a slot sat free while clients waited")
}

// A key at its limit tells a refused caller when its slot should free from
// the key's own holds, spread behind the callers told before: not when its
// earliest lease would expire, which a live holder keeps renewing (the
// lease TTL, 30 s here, whatever the holds), and not from another key's
// holds. A key none of whose holds has ended here still says the expiry.
// On a virtual Redis, in virtual time.
func TestFullKeyRetryAfterFollowsItsHolds(t *testing.T) {
	testrig.Bubble(t, func(t *testing.T) {
		srv := newVirtualRedis(t, fwLatency)
		r := fwFleet(t, srv, "full-key", 1, 1, WithLeaseTTL(30*time.Second), WithLogger(quiet()))[0]
		warm := func(key string, hold time.Duration) {
			for range 3 {
				s, err := r.Acquire(context.Background(), key) // a release reaches the store a moment later
				if !assert.NoError(t, err) {
					return
				}
				time.Sleep(hold)
				s.Release()
			}
		}
		warm("fast", 50*time.Millisecond)
		warm("slow", 4*time.Second)
		refused := func(key string) time.Duration {
			_, err := r.TryAcquire(key)
			var le *slots.LimitError
			if !assert.ErrorAs(t, err, &le, key) {
				return 0
			}
			assert.ErrorIs(t, err, slots.ErrLimitReached)
			return le.RetryAfter
		}
		for _, key := range []string{"fast", "slow", "cold"} {
			s, err := r.Acquire(context.Background(), key)
			if !assert.NoError(t, err) {
				return
			}
			defer s.Release()
		}
		time.Sleep(10 * time.Millisecond) // the holds have begun
		fast, slow, slowAgain, cold := refused("fast"), refused("slow"), refused("slow"), refused("cold")
		t.Logf("told: fast key %v, slow key %v then %v, cold key %v", fast, slow, slowAgain, cold)
		assert.LessOrEqual(t, fast, 100*time.Millisecond, "the fast key's holds")
		assert.GreaterOrEqual(t, slow, 2*time.Second, "the slow key's holds, not the fast key's")
		assert.Less(t, slow, 10*time.Second, "nor the lease's expiry")
		assert.Greater(t, slowAgain, slow, "a caller refused after another is told to come after it")
		assert.GreaterOrEqual(t, cold, 10*time.Second, "a key with no hold ended: the expiry")
	})
}
